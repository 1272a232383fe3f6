"""Placement by disk on the real stack (node hosts in memory; images-at-scale S9): two
nodes, one whose disk budget leaves no room for a create (`AENV_DISK_BUDGET_BYTES`): every
create lands on the other; a template whose recorded sizes fit on neither is refused at
once with E2B's 503 body, which names the disk."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from aenv.logformat import marks
from bus import Bus
from bus.decisions import execute
from bus.nodes import Heartbeat, NodeBook
from domain import template as tp
from tests.support import eventually_sync
from tests.vmless.conftest import VmlessStack, vmless_stack

GIB = 1 << 30
#: node `vmless` (the stack's own) may keep 64 GiB; `vmless-full` 1 MiB, under the 1 GiB
#: headroom every create keeps
ROOMY, FULL = 64 * GIB, 1 << 20


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VmlessStack]:
    root = tmp_path_factory.mktemp("aenv-disk-placement")
    with vmless_stack(root / "stack", AENV_DISK_BUDGET_BYTES=str(ROOMY)) as stack:
        node = _full_node(stack, root / "full")
        try:
            yield stack
        finally:
            node.send_signal(signal.SIGTERM)
            try:
                node.wait(60)
            except subprocess.TimeoutExpired:
                node.kill()
                node.wait(10)


def _full_node(stack: VmlessStack, data: Path) -> subprocess.Popen[bytes]:
    """A second node on the stack's bus whose disk budget is all but spent."""
    data.mkdir(parents=True)
    env = {
        **stack.env,
        "AENV_NODE_ID": "vmless-full",
        "AENV_DATA_DIR": str(data),
        "AENV_DISK_BUDGET_BYTES": str(FULL),
    }
    log = data / "role.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "aenv.serve", "node"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def ready() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"second node exited ({proc.returncode}): {log.read_text()[-3000:]}")
        return any(marks(ln, "ROLE-READY") for ln in log.read_text(errors="replace").splitlines())

    eventually_sync(ready, timeout=60, interval=0.2)
    return proc


def _beats(stack: VmlessStack) -> dict[str, Heartbeat]:
    async def read() -> dict[str, Heartbeat]:
        bus = await Bus.connect(stack.bus_settings, setup=False)
        try:
            book = await NodeBook.open(bus.js, bus.names.nodes_bucket)
            return {b.node_id: b for b in await book.all()}
        finally:
            await bus.close()

    return asyncio.run(read())


def _sized_template(stack: VmlessStack, name: str, image_bytes: int) -> None:
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


def test_a_node_without_disk_room_gets_no_create_and_none_with_room_is_a_503(
    two: VmlessStack,
) -> None:
    # both beat, with the room memory-wise; only their disks differ
    def both() -> dict[str, Heartbeat] | None:
        beats = _beats(two)
        full, roomy = beats.get("vmless-full"), beats.get("vmless")
        ok = full is not None and roomy is not None and full.disk_room is not None
        return beats if ok and roomy.disk_room is not None else None

    beats = eventually_sync(both, timeout=30, interval=0.3)
    assert beats is not None
    full, roomy = beats["vmless-full"], beats["vmless"]
    assert (full.disk_budget, roomy.disk_budget) == (FULL, ROOMY)
    assert full.disk_room is not None and full.disk_room < GIB, full
    assert roomy.disk_room is not None and roomy.disk_room > GIB, roomy
    assert full.free > 0 and "base" in full.templates  # it would take `base` but for its disk
    # `aenv status` shows each node's disk
    status = two.aenv("status")
    assert f'"budget": {FULL}' in status.stdout and f'"budget": {ROOMY}' in status.stdout

    with two.client(timeout=60) as c:
        made: list[str] = []
        try:
            for _ in range(8):
                r = c.post("/v2/sandboxes", json={"templateID": "base", "timeout": 120})
                assert r.status_code == 201, r.text
                made.append(r.json()["sandboxID"])
            nodes = {c.get(f"/sandboxes/{sid}").json()["nodeID"] for sid in made}
            assert nodes == {"vmless"}, nodes
        finally:
            for sid in made:
                c.delete(f"/sandboxes/{sid}")

        # a template whose recorded image is larger than either node's room: refused at
        # once, the disk named (E2B's {code, message} body)
        _sized_template(two, "huge", image_bytes=128 * GIB)

        def refused() -> httpx.Response | None:
            r = c.post("/v2/sandboxes", json={"templateID": "huge", "timeout": 120})
            return r if r.status_code == 503 else None

        r = eventually_sync(refused, timeout=15, interval=0.3)
        assert r is not None
        body = r.json()
        assert body["code"] == 503, body
        message = body["message"]
        assert "no node has disk room for template huge" in message, message
        assert f"needs {128 * GIB + (200 << 20) + GIB} bytes" in message, message
        assert "on vmless" in message, message
        assert r.headers["retry-after"] == "5"
