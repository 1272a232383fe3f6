"""Persistent snapshots through the SDK: capture a running sandbox in place, start new
sandboxes from it (files and processes included), list and delete it."""

from __future__ import annotations

import uuid

import pytest
from e2b import Sandbox
from e2b.exceptions import SandboxException

from tests.e2e.conftest import Stack
from tests.support import eventually_sync

pytestmark = pytest.mark.vm


def test_snapshot_create_start_from_list_delete(stack: Stack) -> None:
    src = Sandbox.create(timeout=300)
    started: list[Sandbox] = []
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    try:
        src.files.write("/home/user/snap.txt", "captured")
        src.commands.run("sleep 100000 >/dev/null 2>&1 &")
        end_before = src.get_info().end_at

        info = src.create_snapshot(name=name)
        assert info.snapshot_id == name and info.names and info.names[0].endswith(name)
        # the source keeps running, id and TTL unchanged
        assert src.get_info().end_at == end_before
        assert src.commands.run("echo still").stdout.strip() == "still"

        for _ in range(2):
            child = Sandbox.create(info.snapshot_id)
            started.append(child)
            assert child.sandbox_id != src.sandbox_id
            assert child.files.read("/home/user/snap.txt") == "captured"
            assert child.commands.run("pgrep -x sleep").stdout.strip() != ""
            assert child.get_info().template_id == name
        started[0].files.write("/home/user/only-0.txt", "x")
        assert not started[1].files.exists("/home/user/only-0.txt")

        listed = [
            s.snapshot_id for s in Sandbox.list_snapshots(sandbox_id=src.sandbox_id).next_items()
        ]
        assert name in listed
    finally:
        for s in started:
            s.kill()
        src.kill()
    assert Sandbox.delete_snapshot(name) is True
    assert name not in [s.snapshot_id for s in Sandbox.list_snapshots().next_items()]
    assert Sandbox.delete_snapshot(name) is False
    with pytest.raises(SandboxException):
        Sandbox.create(name)
    records = stack.data_dir / "node" / "snapshot-templates"
    eventually_sync(lambda: not any(records.glob(f"*{name}*")), timeout=10)  # node freed it


def test_snapshot_is_uploaded_and_pulled_back_when_the_node_lost_it(stack: Stack) -> None:
    """Issue 5: snapshots are durable in S3. Once the node says the capture is uploaded,
    deleting it from the node's disk (state, memory, manifest and its disk layer) loses
    nothing: the next create pulls it from SeaweedFS and the files are there."""
    import json
    import shutil
    from pathlib import Path

    src = Sandbox.create(timeout=300)
    name = f"e2e-durable-{uuid.uuid4().hex[:8]}"
    record = stack.data_dir / "node" / "snapshot-templates" / f"{name}.json"
    child = None
    try:
        src.files.write("/home/user/durable.txt", "from S3")
        src.create_snapshot(name=name)
        doc = eventually_sync(
            lambda: (d := json.loads(record.read_text())).get("uploaded") and d,
            timeout=120,
            interval=0.5,
        )
        capture = Path(doc["snapshot"])
        layer = Path(json.loads((capture / "manifest.json").read_text())["disk_top"])
        shutil.rmtree(capture)
        layer.unlink()
        child = Sandbox.create(name, timeout=120)
        assert child.files.read("/home/user/durable.txt") == "from S3"
        assert (capture / "manifest.json").exists()  # pulled back, so the next create is local
    finally:
        if child is not None:
            child.kill()
        src.kill()
        Sandbox.delete_snapshot(name)
