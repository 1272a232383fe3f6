"""The snapshot worker uploads an imported image's capture (images-at-scale S6) over a real
durable consumer of the template events: a `TemplateImported` on its own node is uploaded
and recorded durable with no source sandbox; another node's import is left to that node."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from pathlib import Path

from bus import Bus
from bus.decisions import execute
from domain import template as tp
from tests.support import eventually
from workers.snapshot.worker import SnapshotWorker


@dataclass(frozen=True)
class _Capture:
    snapshot_id: str
    dir: Path
    base_image_digest: str = "b" * 64
    size_bytes: int = 1
    volumes: tuple[tuple[int, str, Path], ...] = ()
    image_bytes: int = 2


@dataclass(frozen=True)
class _Source:
    sandbox_id: str | None = None


@dataclass
class _Node:
    """This node's side of the port: every template here has a capture `tpl-<name>`."""

    root: Path
    marked: list[str] = field(default_factory=list)

    async def paused_capture(self, sandbox_id: str, snapshot_id: str) -> None:
        return None

    def template_capture(self, name: str) -> _Capture:
        return _Capture(f"tpl-{name}", self.root)

    def template_uploaded(self, name: str, snapshot_id: str) -> _Source:
        self.marked.append(snapshot_id)
        return _Source()


@dataclass
class _Store:
    uploaded: list[str] = field(default_factory=list)

    async def upload(self, snapshot_dir: Path, *, base_image_digest: str, snapshot_id: str) -> None:
        self.uploaded.append(snapshot_id)

    async def upload_volume(self, image: Path, *, key: str, volume_id: str) -> None:
        return None


async def _imported(bus: Bus, name: str, node: str) -> None:
    await execute(bus.templates, tp.RegisterTemplate(template_id=name))
    done = tp.CompleteTemplateImport(template_id=name, image_digest="d" * 64, node_id=node)
    await execute(bus.templates, done)


async def test_an_import_on_this_node_is_uploaded_and_recorded_with_no_source(
    bus: Bus, tmp_path: Path
) -> None:
    node_id = f"n-{secrets.token_hex(3)}"
    ours, theirs = f"img-{secrets.token_hex(8)}", f"img-{secrets.token_hex(8)}"
    node, store = _Node(tmp_path), _Store()
    worker = SnapshotWorker(bus, node_id, node, store)
    await _imported(bus, theirs, "another-node")
    await _imported(bus, ours, node_id)
    await worker.start()
    try:

        async def durable() -> tp.Template | None:
            tpl, _ = await bus.templates.load(ours)
            return tpl if tpl is not None and tpl.capture_key is not None else None

        tpl = await eventually(durable)
        assert tpl is not None and (tpl.capture_key, tpl.capture_of) == (f"tpl-{ours}", None)
        # what placement by disk counts for a node without it: the capture, its disks
        assert (tpl.capture_bytes, tpl.image_bytes) == (1, 2)
        assert store.uploaded == [f"tpl-{ours}"] and node.marked == [f"tpl-{ours}"]
        other, _ = await bus.templates.load(theirs)
        assert other is not None and other.capture_key is None
    finally:
        await worker.stop()
        for spec in (worker.spec(), worker.template_spec()):
            await bus.js.delete_consumer(bus.names.event_stream, spec.durable)
