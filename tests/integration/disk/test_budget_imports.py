"""One disk budget per node, for real (images-at-scale S8): registry imports one after
another into a node's image cache under a 1 GiB budget, no VM. Each import reserves what it
will write first (`import_budget.budgeted`), evicting layer chains and then the least
recently used images. A sampler walks the node's roots ten times a second, outside the
budget's own ledger: the disk never holds more than the budget. The oldest images are
evicted, and one evicted is imported again (pulled and built back)."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.registry import (
    LocalRegistry,
    busybox_tree,
    import_registry,
    layout_with_big_file,
    own_image_cache,
    push,
)
from workers.node.disk import IMAGES, STATE, DiskUsage, scan
from workers.node.disk.budget import DiskBudget, NoRoom
from workers.node.disk.evict import Entry
from workers.node.disk.evictor import CacheEvictor
from workers.node.image import cache
from workers.node.imports import import_image
from workers.node.ports import ImageSource

MiB = 1 << 20
BUDGET = 640 * MiB
HEADROOM = 64 * MiB
BIG = 100 * MiB  # each image's one big file: ~220 MiB kept per import (chain + root disk)
FREE = 16 * MiB
COUNT = 6


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[LocalRegistry]:
    yield from import_registry(tmp_path)


class Sampler:
    """Walks the roots at 10 Hz in a thread of its own; the largest total it saw."""

    def __init__(self, roots: list[tuple[str, Path]]) -> None:
        self.roots = roots
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, scan(self.roots).total)  # type: ignore[arg-type]
            self.samples += 1
            self._stop.wait(0.1)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


async def test_imports_stay_under_one_budget_and_evicted_images_come_back(
    registry: LocalRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = own_image_cache(tmp_path / "node" / "images")
    state = tmp_path / "node" / "state"
    state.mkdir()
    monkeypatch.setenv(cache.CACHE_ENV, str(root))  # `convert_image` builds in the node's
    refs = []
    base = busybox_tree(tmp_path / "base")
    for i in range(COUNT):
        out, _ = layout_with_big_file(
            tmp_path / f"img{i}", base, "/data/big", BIG, f"image-{i}".encode()
        )
        refs.append(push(out, registry, f"budget/img{i}", "1"))
        shutil.rmtree(out)
    evicted: list[Entry] = []
    budget = DiskBudget(
        DiskUsage(state, root),
        BUDGET,
        headroom=HEADROOM,
        evictor=CacheEvictor(root, state),
        on_evicted=evicted.append,
    )
    budget.walk()
    got = []
    t0 = time.monotonic()
    with Sampler([(STATE, state), (IMAGES, root)]) as sampler:
        for i, ref in enumerate(refs):
            img = await import_image(
                f"img{i}", ImageSource(ref=ref), None, free_bytes=FREE, budget=budget
            )
            got.append(img)
            real = scan([(STATE, state), (IMAGES, root)]).total
            assert real <= budget.used(), (i, real, budget.used())  # the ledger errs high
    took = time.monotonic() - t0
    print(
        f"{COUNT} imports in {took:.0f}s; {sampler.samples} samples, peak {sampler.peak >> 20} MiB"
    )
    assert sampler.samples >= 10 * took * 0.5, "the sampler must have kept up"
    assert 0 < sampler.peak <= BUDGET, sampler.peak >> 20

    kinds = [e.category for e in evicted]
    assert "chain" in kinds and "image" in kinds, kinds
    # chains went before any image did
    assert kinds.index("image") > kinds.index("chain")
    gone = [img for img in got if not img.rootfs.exists()]
    kept = [img for img in got if img.rootfs.exists()]
    assert gone and kept[-1] is got[-1], "the newest image stays"
    assert got.index(gone[0]) < got.index(kept[0]), "the oldest images went first"
    for img in gone:
        assert cache.entry_dir(root, img.digest) is None  # its recipes/ link went with it

    # an evicted image is imported again: pulled, built, and kept under the budget
    with Sampler([(STATE, state), (IMAGES, root)]) as sampler:
        back = await import_image(
            "img0-again", ImageSource(ref=refs[0]), None, free_bytes=FREE, budget=budget
        )
    assert back.digest == got[0].digest and back.rootfs.is_file()
    assert cache.entry_dir(root, back.digest) is not None
    assert sampler.peak <= BUDGET, sampler.peak >> 20


async def test_an_import_that_cannot_fit_is_refused_as_unavailable(
    registry: LocalRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = own_image_cache(tmp_path / "node" / "images")
    state = tmp_path / "node" / "state"
    state.mkdir()
    monkeypatch.setenv(cache.CACHE_ENV, str(root))
    out, _ = layout_with_big_file(
        tmp_path / "img", busybox_tree(tmp_path / "base"), "/data/big", BIG, b"too-big"
    )
    ref = push(out, registry, "budget/too-big", "1")
    budget = DiskBudget(DiskUsage(state, root), 2 * BIG, headroom=HEADROOM)
    with pytest.raises(NoRoom) as refused:
        await import_image("big", ImageSource(ref=ref), None, free_bytes=FREE, budget=budget)
    assert refused.value.code == "unavailable"
    assert str(refused.value).startswith("node disk budget: need ")
    assert not (root / "layers").exists() or not any((root / "layers").iterdir())
