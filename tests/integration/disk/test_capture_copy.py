"""A resume whose copy of the capture's RAM file does not fit the disk (issue 30): the
guest never runs and the capture stays whole — not spent. On a real full disk: a tmpfs of
its own holding the capture and the VM's directory, with no room for a second RAM file."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.node.runtime.ramfile import CaptureNotKept, ram_for_restore, start_guest
from workers.node.runtime.rampool import RamPool
from workers.node.runtime.snapshot import Snapshot
from workers.node.vmm.spec import Machine

MiB = 1024 * 1024


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 12 MiB tmpfs of its own."""
    root = tmp_path / "small"
    root.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(root)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


def _capture(root: Path, ram: bytes) -> Snapshot:
    d = root / "snapshots" / "sbx-p1"
    d.mkdir(parents=True)
    (d / "mem").write_bytes(ram)  # data, not holes: a copy must write every byte
    machine = Machine(
        qemu_version="9", accel="tcg", cpu="max", vcpus=1, mem_mib=8, guest_mac="02:00:00:00:00:01"
    )
    return Snapshot("sbx-p1", d, machine, d / "top.qcow2", d / "base.img", d / "runtime.img")


async def _settled() -> None:
    return None


async def test_no_room_for_the_copy_fails_the_resume_before_the_guest_runs(
    small_disk: Path,
) -> None:
    ram = os.urandom(8 * MiB)
    snap = _capture(small_disk, ram)
    ran: list[str] = []

    async def cont() -> None:
        ran.append("cont")

    with pytest.raises(CaptureNotKept, match="stays paused"):
        async with contextlib.AsyncExitStack() as stack:  # as `Runtime.restore` undoes it
            workdir = small_disk / "vms" / "sbx"
            stack.callback(shutil.rmtree, workdir, True)
            pool = RamPool(small_disk / "pool", settled=_settled, pause_point=lambda: None)
            mem, kept = await ram_for_restore(snap, workdir, stack, pool, private=False, adopt=True)
            assert mem.stat().st_ino == snap.mem.stat().st_ino  # adopted: a link, no copy
            assert kept is not None
            await start_guest(snap, kept, cont, resume=True)
    assert ran == []  # the guest never ran on the RAM file it adopted
    assert hashlib.sha256(snap.mem.read_bytes()).digest() == hashlib.sha256(ram).digest()
    assert sorted(p.name for p in snap.dir.iterdir()) == ["mem"]  # no half copy, not spent
    assert not snap.spent
