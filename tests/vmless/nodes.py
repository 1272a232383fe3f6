"""More in-memory nodes on a VM-less stack's bus, and what the tests of placement read and
write beside them: the fleet's heartbeats, a template with recorded sizes."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from aenv.logformat import marks
from bus import Bus
from bus.decisions import execute
from bus.nodes import Heartbeat, NodeBook
from domain import template as tp
from tests.support import eventually_sync
from tests.vmless.conftest import VmlessStack

__all__ = ["beats", "more_nodes", "sized_template"]


@contextmanager
def more_nodes(stack: VmlessStack, root: Path, nodes: dict[str, dict[str, str]]) -> Iterator[None]:
    """Nodes beside the stack's own, by id with their own `AENV_*` settings (data under
    `root/<id>`), started together and each past its ROLE-READY until the block ends."""
    procs: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    try:
        for node_id, env in nodes.items():
            data = root / node_id
            data.mkdir(parents=True)
            log = data / "role.log"
            with open(log, "wb") as out:
                procs[node_id] = (
                    subprocess.Popen(
                        [sys.executable, "-m", "aenv.serve", "node"],
                        env={
                            **stack.env,
                            "AENV_NODE_ID": node_id,
                            "AENV_DATA_DIR": str(data),
                            **env,
                        },
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    ),
                    log,
                )

        def ready() -> bool:
            for node_id, (proc, log) in procs.items():
                if proc.poll() is not None:
                    tail = log.read_text()[-3000:]
                    pytest.fail(f"node {node_id} exited ({proc.returncode}): {tail}")
            return all(
                any(marks(ln, "ROLE-READY") for ln in log.read_text(errors="replace").splitlines())
                for _, log in procs.values()
            )

        eventually_sync(ready, timeout=60, interval=0.2)
        yield
    finally:
        for proc, _ in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc, _ in procs.values():
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def beats(stack: VmlessStack) -> dict[str, Heartbeat]:
    async def read() -> dict[str, Heartbeat]:
        bus = await Bus.connect(stack.bus_settings, setup=False)
        try:
            book = await NodeBook.open(bus.js, bus.names.nodes_bucket)
            return {b.node_id: b for b in await book.all()}
        finally:
            await bus.close()

    return asyncio.run(read())


def sized_template(stack: VmlessStack, name: str, image_bytes: int) -> None:
    """A template whose upload recorded `image_bytes` of disks under its capture: what a
    node uploading a big image's capture would write (no repository in this tier)."""

    async def write() -> None:
        bus = await Bus.connect(stack.bus_settings, setup=False)
        try:
            await execute(bus.templates, tp.RegisterTemplate(template_id=name, cpu_count=1))
            up = tp.RecordTemplateUpload(
                template_id=name, key=name, capture_bytes=200 << 20, image_bytes=image_bytes
            )
            await execute(bus.templates, up)
        finally:
            await bus.close()

    asyncio.run(write())
