"""The node's disk budget (images-at-scale S8) over a real directory tree: its arithmetic,
reservations adding up, eviction making room in the plan's order, and a write that cannot
fit refused as `unavailable` with the numbers."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import pytest

from workers.node.disk import DiskUsage
from workers.node.disk.budget import DiskBudget, NoRoom, budget_of
from workers.node.disk.evictor import CacheEvictor
from workers.node.disk.node import NodeDisk
from workers.node.disk.usage import allocated
from workers.node.settings import NodeSettings

MiB = 1 << 20
DIGEST = "cd" * 32


def _file(path: Path, size: int, when: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))
    if when is not None:
        os.utime(path, (when, when))
        os.utime(path.parent, (when, when))
    return path


def _image(root: Path, name: str, size: int, when: float) -> Path:
    d = root / "images" / name
    _file(d / "root.ext4", size)
    _file(d / "manifest.json", 10)
    os.utime(d, (when, when))
    (root / "recipes").mkdir(exist_ok=True)
    (root / "recipes" / f"r-{name}").symlink_to(f"../images/{name}")
    return d


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    state, images = tmp_path / "state", tmp_path / "images"
    state.mkdir()
    images.mkdir()
    return state, images


def _budget(roots: tuple[Path, Path], budget: int, headroom: int = 0) -> DiskBudget:
    state, images = roots
    return DiskBudget(
        DiskUsage(state, images), budget, headroom=headroom, evictor=CacheEvictor(images, state)
    )


def test_budget_is_the_setting_or_a_share_of_each_filesystem_once(tmp_path: Path) -> None:
    assert budget_of([tmp_path], bytes_=123) == 123
    st = os.statvfs(tmp_path)
    whole = st.f_blocks * st.f_frsize
    # two roots on one filesystem count it once; a root not made yet: its parent's
    got = budget_of([tmp_path / "a", tmp_path / "b" / "c"], share=0.5)
    assert got == int(0.5 * whole)


def test_arithmetic_and_reservations_add_up(roots: tuple[Path, Path]) -> None:
    state, _images = roots
    _file(state / "journal", 2 * MiB)
    b = _budget(roots, 100 * MiB, headroom=10 * MiB)
    walked = b.used()  # walks once when asked first
    assert walked >= 2 * MiB
    assert b.limit == 90 * MiB and b.free() == 90 * MiB - walked
    with b.reserve(30 * MiB) as one, b.reserve(20 * MiB):
        assert b.reserved() == 50 * MiB
        assert b.free() == 40 * MiB - walked
        one.charge(5 * MiB)  # wrote part of it: counted once, not twice
        assert b.accounted() == walked + 45 * MiB
        with pytest.raises(NoRoom) as refused:
            b.reserve(60 * MiB).__enter__()
    assert refused.value.code == "unavailable"
    assert str(refused.value).startswith("node disk budget: need 60 MiB, 0 MiB evictable, ")
    assert b.reserved() == 0 and b.used() == walked + 5 * MiB
    b.walk()  # the walk replaces the tally with what is there
    assert b.used() == walked


def test_additions_during_a_walk_are_kept_removals_dropped(roots: tuple[Path, Path]) -> None:
    b = _budget(roots, 100 * MiB)
    base = b.used()
    with b._walking() as ended:
        b.added(3 * MiB)
        b.removed(1 * MiB)
        ended(b.usage.walk_now())
    assert b.used() == base + 3 * MiB  # high until the next walk, never low
    with pytest.raises(OSError), b._walking():
        b.added(MiB)
        raise OSError("the walk failed")  # replaces nothing: the addition stays counted
    assert b.used() == base + 4 * MiB


def test_make_room_evicts_in_the_plans_order(roots: tuple[Path, Path]) -> None:
    state, images = roots
    old = _image(images, "a" * 64, 8 * MiB, when=1000)
    new = _image(images, "b" * 64, 8 * MiB, when=2000)
    chain = _file(images / "layers" / "sha256-1" / "tree" / "f", 4 * MiB, when=3000).parents[1]
    blob = _file(images / "blobs" / "sha256" / DIGEST, 4 * MiB, when=3000)
    kernel = _file(images / "kernel-6.1" / "vmlinux", 4 * MiB, when=1)
    b = _budget(roots, 40 * MiB)
    used = b.used()
    assert 28 * MiB <= used < 30 * MiB
    assert b.room() == b.free() + allocated(old) + allocated(new) + allocated(chain) + 4 * MiB

    assert b.make_room(b.free() + 6 * MiB)  # chain and blob go first, the images stay
    assert not chain.exists() and not blob.exists() and old.exists() and new.exists()
    assert b.make_room(b.free() + 1)  # then the least recently used image, and its link
    assert not old.exists() and new.exists() and kernel.exists()
    assert not (images / "recipes" / f"r-{'a' * 64}").exists()
    assert (images / "recipes" / f"r-{'b' * 64}").exists()
    assert b.used() >= allocated(images) + allocated(state)  # the tally stayed high
    b.walk()
    assert b.used() == allocated(images) + allocated(state)
    assert not b.make_room(100 * MiB)  # cannot help: nothing removed
    assert new.exists()


def test_pinned_and_in_flight_entries_stay(roots: tuple[Path, Path]) -> None:
    _state, images = roots
    img = _image(images, "a" * 64, 8 * MiB, when=1000)
    b = _budget(roots, 20 * MiB)
    with b.pinned_while([str(img)]):
        assert b.pinned() == allocated(img)
        assert not b.make_room(b.free() + MiB)
    assert b.pinned() == 0
    with b.reserve(MiB):  # a build in flight: what it just made is not evicted under it
        chain = _file(images / "layers" / "sha256-2" / "f", 4 * MiB).parent
        assert b.make_room(b.free() + MiB)
        assert chain.exists() and not img.exists()


def test_concurrent_reservations_never_pass_the_limit(roots: tuple[Path, Path]) -> None:
    b = _budget(roots, 64 * MiB)
    peak = [0]
    errors: list[Exception] = []

    def writer() -> None:
        for _ in range(50):
            try:
                with b.reserve(10 * MiB):
                    peak[0] = max(peak[0], b.accounted())
            except NoRoom:
                pass
            except Exception as e:  # pragma: no cover - a failure to report
                errors.append(e)

    threads = [threading.Thread(target=writer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and 0 < peak[0] <= b.limit and b.reserved() == 0


async def test_node_disk_numbers_for_heartbeat_and_scrape(roots: tuple[Path, Path]) -> None:
    state, images = roots
    _image(images, "a" * 64, 4 * MiB, when=1000)
    settings = NodeSettings(state_dir=state, disk_budget_bytes=64 * MiB, disk_headroom_bytes=0)
    disk = NodeDisk(settings, images)
    assert disk.used() is None and disk.room() is None  # nothing before the first walk
    cache_room = disk.blob_cache_room(10 * MiB, lambda: 2 * MiB)
    assert cache_room() == 10 * MiB  # no walk yet: the cap
    await disk.refresh()
    used = disk.used()
    assert used is not None and used >= 4 * MiB
    numbers = disk.numbers()
    assert numbers["budget"] == 64 * MiB and numbers["pinned"] == 0
    assert numbers["room"] == 64 * MiB - used + allocated(images / "images" / ("a" * 64))
    assert cache_room() == 10 * MiB
    assert disk.blob_cache_room(100 * MiB, lambda: 2 * MiB)() == 2 * MiB + 64 * MiB - used
    disk.held_by(lambda: [images / "images" / ("a" * 64) / "root.ext4"])
    await disk.refresh()
    assert disk.pinned() == allocated(images / "images" / ("a" * 64))


def test_an_eviction_that_frees_less_than_planned_is_planned_again(
    roots: tuple[Path, Path],
) -> None:
    """The first plan takes the blob-cache file (regenerable first), but a download holds
    it and nothing is freed: a second plan takes the image, and the room is made."""
    state, images = roots
    img = _image(images, "a" * 64, 8 * MiB, when=1000)
    held = _file(state / "blob-cache" / "ab" / DIGEST, 8 * MiB, when=3000)
    b = _budget(roots, 24 * MiB)
    evicted: list[str] = []
    b.on_evicted = lambda e: evicted.append(e.category)
    assert isinstance(b.evictor, CacheEvictor)
    b.evictor.drop_blob = lambda _path: False  # a download holds every blob
    assert b.make_room(b.free() + 6 * MiB)
    assert evicted == ["blob_cache", "image"], evicted
    assert held.exists() and not img.exists()


async def test_a_change_is_walked_soon_not_on_the_minute(roots: tuple[Path, Path]) -> None:
    """A sandbox gone (`changed`): the room the API places by is walked again within
    `soon_s`, not a minute later (a create refused 503 right after kills made room)."""
    import asyncio

    state, images = roots
    settings = NodeSettings(state_dir=state, disk_budget_bytes=64 * MiB, disk_headroom_bytes=0)
    disk = NodeDisk(settings, images)
    loop = asyncio.create_task(disk.run_forever(every_s=60.0, soon_s=0.05))
    try:
        for _ in range(100):
            if disk.room() is not None:
                break
            await asyncio.sleep(0.02)
        before = disk.room()
        assert before is not None
        _file(state / "vms" / "gone" / "ram", 8 * MiB)  # as if a sandbox's files were here
        await asyncio.sleep(0.3)
        assert disk.room() == before  # no walk on its own: the minute is far
        (state / "vms" / "gone" / "ram").unlink()
        _file(state / "vms" / "new" / "ram", 4 * MiB)
        disk.changed()
        for _ in range(100):
            if disk.room() != before:
                break
            await asyncio.sleep(0.02)
        taken = before - (disk.room() or 0)  # the new file and its directories' blocks
        assert 4 * MiB <= taken <= 4 * MiB + 64 * 1024, taken
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop


def test_a_running_vm_holds_what_its_directory_may_still_grow_to(roots: tuple[Path, Path]) -> None:
    """The catalogue's sandboxes filled their RAM files by ~150 MiB each after the restore
    ended: the room they may still take is the budget's, until their directory goes."""
    state, _ = roots
    vm = state / "vms" / "vm1"
    _file(vm / "mem", 2 * MiB)
    b = _budget(roots, 64 * MiB)
    b.walk()
    used = b.used()
    b.grows(vm, 10 * MiB)
    assert b.reserved() == 10 * MiB - allocated(vm)
    assert b.accounted() >= used + 8 * MiB - 64 * 1024
    _file(vm / "mem", 6 * MiB)  # the guest touched more: the walk sees it, the hold shrinks
    b.walk()
    assert b.accounted() >= b.used() + 10 * MiB - allocated(vm) - 64 * 1024
    assert b.used() + b.reserved() >= allocated(state) + 4 * MiB - 64 * 1024
    # what the VM may still take is not free for a write
    with pytest.raises(NoRoom), b.reserve(64 * MiB - b.used() - 2 * MiB):
        pass
    for f in vm.iterdir():
        f.unlink()
    vm.rmdir()
    assert b.reserved() == 0  # gone: nothing held for it
    b.walk()
    assert b.reserved() == 0


def test_a_paused_vm_holds_nothing_more(roots: tuple[Path, Path]) -> None:
    state, _ = roots
    vm = state / "vms" / "vm2"
    _file(vm / "mem", 1 * MiB)
    b = _budget(roots, 64 * MiB)
    b.grows(vm, 10 * MiB)
    assert b.reserved() > 0
    b.stops_growing(vm)  # its directory still there, its capture reserving the RAM
    assert b.reserved() == 0


def test_a_killed_vm_gives_back_what_the_tally_counted_for_it_at_once(
    roots: tuple[Path, Path],
) -> None:
    """A kill frees the VM's directory now, not at the next walk: the next create is
    placed by that room. What goes back is what the tally counted (its size when it began
    growing, or as the last ended walk measured it), never what it grew to since (held,
    not counted): the ledger stays high, never low."""
    state, images = roots
    vm = state / "vms" / "vm3"
    vm.parent.mkdir(parents=True, exist_ok=True)
    b = _budget(roots, 64 * MiB)
    b.walk()
    empty = b.used()
    with b.reserve(4 * MiB) as r:  # the restore: its RAM file copied, charged
        _file(vm / "mem", 2 * MiB)
        b.grows(vm, 10 * MiB)
        r.charge(allocated(vm))
    assert b.used() == empty + allocated(vm)
    _file(vm / "mem", 5 * MiB)  # the guest touched more: held, not counted
    assert b.used() == empty + 2 * MiB + (allocated(vm) - 5 * MiB)
    b.gone(vm)  # the kill: its directory is deleted
    for f in vm.iterdir():
        f.unlink()
    vm.rmdir()
    assert b.reserved() == 0
    assert b.used() == empty
    assert b.used() >= allocated(state) + allocated(images)  # high, never low


def test_a_walk_raises_what_a_kill_gives_back_only_once_it_ended(
    roots: tuple[Path, Path],
) -> None:
    state, _ = roots
    vm = state / "vms" / "vm4"
    _file(vm / "mem", 1 * MiB)
    b = _budget(roots, 64 * MiB)
    b.walk()
    b.grows(vm, 10 * MiB)
    _file(vm / "mem", 6 * MiB)
    b.walk()  # counted 6 MiB now: the kill gives that back
    before = b.used()
    b.gone(vm)
    assert before - b.used() == allocated(vm)
    b.gone(vm)  # twice: nothing more
    assert before - b.used() == allocated(vm)
