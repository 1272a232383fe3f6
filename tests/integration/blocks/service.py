"""The block service as the node runs it: a real subprocess (`python -m aenv.roles.blocks
serve`) on a unix socket, over a real repository; and the QEMU tools that read from it."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aenv.roles.blocks import READY

MiB = 1 << 20


@dataclass
class BlockService:
    """One service process; `start` again after `kill9` restarts it on the same socket."""

    socket: Path
    cache_dir: Path
    cache_bytes: int
    env: dict[str, str]
    args: tuple[str, ...] = ()  # more of `serve`'s options
    proc: asyncio.subprocess.Process | None = field(default=None, init=False)

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "aenv.roles.blocks",
            "serve",
            "--socket",
            str(self.socket),
            "--cache-dir",
            str(self.cache_dir),
            "--cache-bytes",
            str(self.cache_bytes),
            *self.args,
            env=self.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=(self.cache_dir.parent / "blocks.log").open("ab"),
        )
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 30)
        assert line.decode().startswith(f"{READY} {self.socket}"), line

    async def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        await self.proc.wait()

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            await asyncio.wait_for(self.proc.wait(), 10)

    def stats(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads((self.cache_dir / "stats.json").read_text())
        return doc

    def url(self, digest: str) -> str:
        return f"nbd+unix:///{digest}?socket={self.socket}"


def service_env(store: str, where: str) -> dict[str, str]:
    """The environment a node gives the service: its repository, nothing else of ours."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AENV_")}
    if store == "posix":
        env["AENV_SNAPSHOT_DIR"] = where
    else:
        ep = json.loads(where)
        env.update(
            AENV_S3_ENDPOINT=ep["url"],
            AENV_S3_ACCESS_KEY=ep["access_key"],
            AENV_S3_SECRET_KEY=ep["secret_key"],
            AENV_S3_BUCKET=ep["bucket"],
        )
    return env


async def run(*argv: str, timeout: float = 120) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


def make_image(path: Path, size: int, seed: int, regions: int) -> None:
    """A sparse-ish raw disk: `regions` runs of random bytes at random places, one run of
    written zeros (allocated, yet a null chunk), holes elsewhere."""
    rng = random.Random(seed)
    with path.open("wb") as f:
        f.truncate(size)
        for _ in range(regions):
            length = rng.randrange(256 << 10, 4 * MiB)
            offset = rng.randrange(0, size - length) & ~0xFFFF
            f.seek(offset)
            f.write(rng.randbytes(length))
        f.seek(size // 2 & ~(4 * MiB - 1))
        f.write(bytes(4 * MiB))


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(MiB):
            h.update(block)
    return h.hexdigest()
