"""What an eviction frees (issue 42): only the inodes all of whose links lie inside the
entry; blocks hard-linked from another entry or from outside the evictable cache stay, and
the ledger is told so. Real files in a tmp dir."""

from __future__ import annotations

import os
from pathlib import Path

from workers.node.disk import DiskUsage
from workers.node.disk.budget import DiskBudget
from workers.node.disk.evictor import CacheEvictor
from workers.node.disk.produced import METADATA, writing
from workers.node.disk.shares import holding, made
from workers.node.disk.usage import allocated

MiB = 1 << 20


def _file(path: Path, size: int, when: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))
    for p in (path, path.parent, path.parent.parent):
        os.utime(p, (when, when))
    return path


def _chains(images: Path) -> tuple[Path, Path, int]:
    """Two chains (older `a`, newer `b`) that share one 4 MiB file by a hard link; each
    has 1 MiB of its own. Returns them and the shared file's allocated bytes."""
    shared = _file(images / "layers" / "sha256-a" / "tree" / "base", 4 * MiB, when=1000)
    _file(images / "layers" / "sha256-a" / "tree" / "own", MiB, when=1000)
    b_tree = images / "layers" / "sha256-b" / "tree"
    _file(b_tree / "own", MiB, when=2000)
    os.link(shared, b_tree / "base")
    for p in (b_tree, b_tree.parent):
        os.utime(p, (2000, 2000))
    return images / "layers" / "sha256-a", images / "layers" / "sha256-b", allocated(shared)


def test_removal_frees_what_the_entry_alone_links_then_the_last_frees_the_shared(
    tmp_path: Path,
) -> None:
    images = tmp_path / "images"
    a, b, shared = _chains(images)
    evictor = CacheEvictor(images, None)
    sizes = {e.key: e.bytes for e in evictor.entries()}
    # the shared file counts once, for the chain the plan takes last (the newer)
    assert sizes[str(a)] == allocated(a) - shared
    assert sizes[str(b)] == allocated(b)
    layers_dir = os.lstat(images / "layers").st_blocks * 512  # no entry's
    assert sum(sizes.values()) == allocated(images / "layers") - layers_dir

    [first] = [e for e in evictor.entries() if e.key == str(a)]
    before, own = allocated(images), allocated(a) - shared
    assert evictor.remove(first) == own == before - allocated(images)
    [second] = evictor.entries()
    assert second.bytes == allocated(b)  # now it alone holds the shared file
    before = allocated(images)
    assert evictor.remove(second) == before - allocated(images)
    assert evictor.remove(second) == 0  # gone already: nothing freed


def test_files_linked_from_outside_the_entries_count_for_none(tmp_path: Path) -> None:
    images = tmp_path / "images"
    image = images / "images" / ("c" * 64)
    kernel = _file(images / "kernel-6.1" / "vmlinux", 4 * MiB, when=1)
    _file(image / "root.ext4", 2 * MiB, when=1000)
    _file(image / "manifest.json", 10, when=1000)
    os.link(kernel, image / "vmlinux")
    (images / ".locks").mkdir()  # the content lock's directory: made by the removal
    evictor = CacheEvictor(images, None)
    [entry] = evictor.entries()
    assert entry.bytes == holding(image).own == allocated(image) - allocated(kernel)
    before = allocated(images)
    assert evictor.remove(entry) == entry.bytes == before - allocated(images)
    assert kernel.exists()


def test_the_ledger_counts_what_was_freed_not_what_was_listed(tmp_path: Path) -> None:
    state, images = tmp_path / "state", tmp_path / "images"
    state.mkdir()
    a, b, shared = _chains(images)
    budget = DiskBudget(
        DiskUsage(state, images), 64 * MiB, headroom=0, evictor=CacheEvictor(images, state)
    )
    budget.walk()
    budget.budget = budget.used()  # nothing free: the older chain has to go for 512 KiB
    assert budget.make_room(MiB // 2)
    assert not a.exists() and b.exists()
    by_ledger = budget.used()
    budget.walk()
    assert budget.used() == by_ledger  # the ledger agrees with a fresh walk
    # listed, chain a held 5 MiB; it freed 1 MiB: the shared file stays with chain b
    assert allocated(b) > shared


def test_a_write_is_charged_what_it_made_not_what_it_linked(tmp_path: Path) -> None:
    """A new image's link to the kernel's vmlinux adds nothing; a new file linked from
    two new places counts once (`produced.writing` charges this)."""
    state, images = tmp_path / "state", tmp_path / "images"
    state.mkdir()
    kernel = _file(images / "kernel-6.1" / "vmlinux", 4 * MiB, when=1)
    budget = DiskBudget(DiskUsage(state, images), 64 * MiB, headroom=0)
    budget.walk()
    watched = [images / "images", images / "layers"]
    for d in watched:
        d.mkdir()
    with writing(budget, 8 * MiB, watched):
        image = images / "images" / ("c" * 64)
        root = _file(image / "root.ext4", 2 * MiB, when=1000)
        os.link(kernel, image / "vmlinux")
        (images / "layers" / "sha256-1").mkdir()
        os.link(root, images / "layers" / "sha256-1" / "root")  # new, linked twice
    new = [image, images / "layers" / "sha256-1"]
    assert made(new) == allocated(image) - allocated(kernel) + os.lstat(new[1]).st_blocks * 512
    assert budget.used() == budget.usage.walk_now().total + METADATA - _dirs(watched)


def _dirs(paths: list[Path]) -> int:
    """Directories made before the write, after the first walk: not its charge."""
    return sum(os.lstat(p).st_blocks * 512 for p in paths)
