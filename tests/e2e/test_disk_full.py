"""A full disk is an event and a clear error, never a stopped VM called running
(images-at-scale S10, issue 42).

A stack of its own whose node state dir is a small tmpfs: the sandboxes' disk layers and
RAM files live there. The test fills the host by a file of its own beside them, so a
sandbox's `dd` finds the host full within a few MiB: its VM stops (`werror=enospc`) and
the node's disk watch takes over. Room made within the grace (the test deletes its file)
lets the VM go on; a host left full ends the sandbox with a disk-full `SandboxKilled`.
A guest filling its own root disk (small here: `AENV_IMAGE_FREE_BYTES`) is a
`SandboxDiskFull`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import nats
import pytest
from e2b import Sandbox

from domain import sandbox as sb
from tests.support import eventually_sync, tagged
from tests.vmstack import running_stack

pytestmark = pytest.mark.vm

MIB = 1 << 20
#: the node's state dir: the base template's capture, sandboxes' RAM files and disk layers (a
#: guest filling its root twice may not have its first file's clusters discarded)
TMPFS = "2400m"
#: a guest's root disk keeps this much free beyond its image (a guest fills it in seconds)
GUEST_FREE = 384 * MIB
#: what the host keeps free once the test's file is in: less than a `dd` writes
HOST_LEFT = 64 * MIB
GRACE_S = 12.0


@dataclass(frozen=True)
class FullStack:
    data: Path
    node: Path
    api_url: str
    api_key: str
    nats_url: str

    def get(self, sandbox_id: str) -> httpx.Response:
        with httpx.Client(base_url=self.api_url, headers={"X-API-KEY": self.api_key}) as c:
            return c.get(f"/sandboxes/{sandbox_id}", timeout=30)

    def logged(self, *words: str) -> bool:
        text = (self.data / "aenv.log").read_text(errors="replace")
        return any(all(w in line for w in words) for line in text.splitlines())


@pytest.fixture(scope="module")
def full_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FullStack]:
    if os.geteuid() != 0:
        pytest.skip("the stack runs microVMs and mounts a tmpfs: needs root")
    data = tmp_path_factory.mktemp("aenv-diskfull")
    node = data / "node"
    node.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS}", "tmpfs", str(node)], check=True)
    prefix = tagged("aenvd")
    env = {
        **os.environ,
        "AENV_SLOT_PREFIX": prefix,
        "AENV_NODE_ID": "diskfull",
        "AENV_IMAGE_FREE_BYTES": str(GUEST_FREE),
        "AENV_DISK_FULL_GRACE_S": str(GRACE_S),
        "AENV_METRICS_EVERY_S": "1",
        # nothing of the node's own on the tmpfs beyond the sandboxes' and base's files
        "AENV_WARM_POOL_MIB": "0",
        "AENV_RAM_POOL_BYTES": "0",
    }
    try:
        with running_stack(data, env, prefix) as exports:
            import json

            info = json.loads((data / "stack.json").read_text())
            yield FullStack(
                data, node, exports["E2B_API_URL"], exports["E2B_API_KEY"], info["nats_url"]
            )
    finally:
        subprocess.run(["umount", "-l", str(node)], check=False)
        shutil.rmtree(node, ignore_errors=True)


@contextlib.contextmanager
def host_filled(node: Path) -> Iterator[Path]:
    """A file of the test's own taking all but `HOST_LEFT` of the state dir's disk."""
    filler = node / "test-filler"
    vfs = os.statvfs(node)
    size = vfs.f_bavail * vfs.f_frsize - HOST_LEFT
    assert size > 0, f"the tmpfs has only {vfs.f_bavail * vfs.f_frsize >> 20} MiB free"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
    finally:
        os.close(fd)
    try:
        yield filler
    finally:
        filler.unlink(missing_ok=True)


def _fill(sbx: Sandbox) -> None:
    # direct I/O: the guest's page cache (its RAM file, on the same tmpfs) stays as it is
    sbx.commands.run(
        "dd if=/dev/zero of=/home/user/fill bs=1M count=256 oflag=direct && echo ok > done",
        background=True,
    )


def test_room_made_within_the_grace_lets_the_vm_go_on(full_stack: FullStack) -> None:
    sbx = Sandbox.create("base", timeout=600)
    try:
        with host_filled(full_stack.node) as filler:
            _fill(sbx)
            eventually_sync(
                lambda: full_stack.logged(sbx.sandbox_id, "host disk full"), timeout=120
            )
            filler.unlink()  # room made (the node's eviction's part, played by the test)
            eventually_sync(
                lambda: full_stack.logged(sbx.sandbox_id, "runs again"), timeout=GRACE_S + 10
            )
        out = eventually_sync(lambda: sbx.commands.run("cat done").stdout, timeout=120)
        assert out.strip() == "ok"
        assert full_stack.get(sbx.sandbox_id).json()["state"] == "running"
    finally:
        sbx.kill()


def test_a_host_left_full_ends_the_sandbox_with_a_disk_full_error(full_stack: FullStack) -> None:
    sbx = Sandbox.create("base", timeout=600)
    sid = sbx.sandbox_id
    try:
        with host_filled(full_stack.node):
            _fill(sbx)
            eventually_sync(lambda: full_stack.logged(sid, "host disk full"), timeout=120)
            stopped_at = time.monotonic()
            # the VM stands stopped: running is said for the grace at most, then never
            while (r := full_stack.get(sid)).status_code == 200:
                assert r.json()["state"] == "running"
                waited = time.monotonic() - stopped_at
                assert waited < GRACE_S + 30, "a VM stopped on a full disk is still running"
                time.sleep(0.5)
            assert r.status_code == 404, r.text
        errors = asyncio.run(_killed_errors(full_stack.nats_url, sid))
        assert len(errors) == 1 and "disk is full" in (errors[0] or ""), errors
    finally:
        with contextlib.suppress(Exception):
            sbx.kill()


async def _killed_errors(nats_url: str, sandbox_id: str) -> list[str | None]:
    from bus import BusSettings
    from projections.audit import read_log

    nc = await nats.connect(nats_url)
    try:
        recs = await read_log(nc.jetstream(), BusSettings(nats_url=nats_url))
    finally:
        await nc.close()
    return [
        r.event.error
        for r in recs
        if r.envelope.aggregate_id == sandbox_id and isinstance(r.event, sb.SandboxKilled)
    ]


def test_a_guest_filling_its_own_root_is_an_event(full_stack: FullStack) -> None:
    sbx = Sandbox.create("base", timeout=600)
    sid = sbx.sandbox_id
    try:
        assert "diskFullAt" not in full_stack.get(sid).json()
        # its root keeps GUEST_FREE beyond the image: less than the host has left
        sbx.commands.run("dd if=/dev/zero of=/home/user/big bs=1M oflag=direct; true", timeout=300)
        df = sbx.commands.run("df -B1 / /home/user").stdout
        try:
            at = eventually_sync(lambda: full_stack.get(sid).json().get("diskFullAt"), timeout=60)
        except AssertionError as e:
            raise AssertionError(f"no diskFullAt; the guest's df:\n{df}") from e
        assert full_stack.get(sid).json()["state"] == "running"  # it runs on
        assert sbx.commands.run("echo still here").stdout == "still here\n"
        types = asyncio.run(_types(full_stack.nats_url, sid))
        assert types.count("SandboxDiskFull") == 1, types
        # room again, then full again: a second episode
        sbx.commands.run("rm /home/user/big && sync")
        time.sleep(3)  # samples every second: the observer sees the room
        sbx.commands.run("dd if=/dev/zero of=/home/user/big bs=1M oflag=direct; true", timeout=300)
        eventually_sync(lambda: full_stack.get(sid).json().get("diskFullAt") != at, timeout=60)
        assert asyncio.run(_types(full_stack.nats_url, sid)).count("SandboxDiskFull") == 2
    finally:
        sbx.kill()


async def _types(nats_url: str, sandbox_id: str) -> list[str]:
    from bus import BusSettings
    from projections.audit import read_log

    nc = await nats.connect(nats_url)
    try:
        recs = await read_log(nc.jetstream(), BusSettings(nats_url=nats_url))
    finally:
        await nc.close()
    return [type(r.event).__name__ for r in recs if r.envelope.aggregate_id == sandbox_id]
