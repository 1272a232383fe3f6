"""Template captures under the disk budget (images-at-scale S8): an uploaded one goes (its
record kept, so the next create pulls it back: `TemplateNotLocal`), its base image only
after it; one not uploaded, or one a running sandbox uses, stays. The catalog is the real
`TemplateCatalog` over a state dir; the runtime is a stand-in with its state dir and
`delete_snapshot` (what the evictor calls), since no VM runs here."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from workers.node.disk import DiskUsage
from workers.node.disk.budget import DiskBudget
from workers.node.disk.captures import TemplateCaptures
from workers.node.disk.evictor import CacheEvictor
from workers.node.runtime import Snapshot
from workers.node.templates import TemplateCatalog, TemplateNotLocal
from workers.node.vmm.spec import Machine

MiB = 1 << 20


class Runtime:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.deleted: list[Path] = []

    def delete_snapshot(self, snap: Snapshot) -> None:
        self.deleted.append(snap.dir)
        shutil.rmtree(snap.dir)


class Host:
    def __init__(self, templates: TemplateCatalog, runtime: Runtime) -> None:
        self.templates, self.runtime = templates, runtime
        self.collected = 0

    def collect_soon(self) -> None:
        self.collected += 1


def _image(images: Path, content: str, when: float) -> Path:
    d = images / "images" / content
    d.mkdir(parents=True)
    (d / "root.ext4").write_bytes(os.urandom(4 * MiB))
    (d / "manifest.json").write_text("{}")
    os.utime(d, (when, when))
    return d


def _capture(state: Path, name: str, base: Path, when: float) -> Snapshot:
    d = state / "snapshots" / f"tpl-{name}"
    d.mkdir(parents=True)
    for f in ("mem", "state", "top.qcow2"):
        (d / f).write_bytes(os.urandom(2 * MiB))
    (d / "manifest.json").write_text("{}")
    os.utime(d, (when, when))
    machine = Machine("9", "tcg", "max", 1, 512, "02:00:00:00:00:01")  # type: ignore[arg-type]
    return Snapshot(f"tpl-{name}", d, machine, d / "top.qcow2", base, base)


@pytest.fixture
def node(tmp_path: Path) -> tuple[Path, Path]:
    state, images = tmp_path / "state", tmp_path / "images"
    state.mkdir()
    images.mkdir()
    return state, images


async def test_uploaded_captures_go_before_their_images(node: tuple[Path, Path]) -> None:
    state, images = node
    runtime = Runtime(state)
    catalog = TemplateCatalog(runtime)  # type: ignore[arg-type]
    host = Host(catalog, runtime)
    old_img = _image(images, "a" * 64, when=1000)
    new_img = _image(images, "b" * 64, when=1000)
    up = _capture(state, "up", old_img / "root.ext4", when=2000)
    only = _capture(state, "only", new_img / "root.ext4", when=1500)
    catalog.adopt("up", up)
    catalog.adopt("only", only)
    assert catalog.mark_uploaded("up", up)
    busy: set[str] = set()
    evictor = CacheEvictor(images, state)
    evictor.captures = TemplateCaptures(host, lambda: busy, asyncio.get_running_loop())
    budget = DiskBudget(DiskUsage(state, images), 64 * MiB, headroom=0, evictor=evictor)

    busy.add("up")  # a running sandbox of it: nothing of it goes
    assert not budget.make_room(budget.free() + MiB)
    busy.clear()
    assert budget.make_room(budget.free() + 5 * MiB)  # the capture frees enough
    assert runtime.deleted == [up.dir] and old_img.exists()
    assert budget.make_room(budget.free() + MiB)  # then its base image may go
    assert not old_img.exists()
    # the image under the capture not uploaded stays, and so does that capture
    assert new_img.exists() and only.dir.exists()
    assert not budget.make_room(budget.free() + 100 * MiB)
    await asyncio.sleep(0)  # the layer GC was asked for, on the loop
    assert host.collected == 1

    # the record stays: the next create pulls the capture back from the repository
    assert catalog.held() == ("only",)
    with pytest.raises(TemplateNotLocal) as gone:
        await catalog.get("up")
    assert gone.value.key == "tpl-up" and gone.value.base_image == old_img / "root.ext4"
