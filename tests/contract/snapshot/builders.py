"""A realistic node snapshot on disk, built with the real tools: a raw base, a qcow2 chain
made by `qemu-img create -b` and written by `qemu-io`, a sparse RAM file, device state,
and the node's own manifest.json (written by the node's `Snapshot` class)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from shared.sparse import data_extents
from workers.node.runtime.snapshot import Snapshot
from workers.node.vmm.spec import Machine

MIB = 1 << 20
MEM_SIZE = 512 * MIB
# (offset, length) of random data in guest RAM: ~26 MiB over 512 MiB, some straddling chunks
MEM_REGIONS = [
    (0, 3 * MIB),
    (10 * MIB + 4096, 5 * MIB),
    (100 * MIB, 2 * MIB),
    (255 * MIB, 6 * MIB),
    (400 * MIB + 12345, 4 * MIB),
    (MEM_SIZE - 6 * MIB, 6 * MIB),
]
MACHINE = Machine(
    qemu_version="7.2.22",
    accel="tcg",
    cpu="max",
    vcpus=1,
    mem_mib=512,
    guest_mac="02:00:00:aa:00:01",
)


@dataclass(frozen=True)
class BuiltSnapshot:
    dir: Path
    base: Path
    layers: list[Path]  # bottom -> top

    @property
    def mem(self) -> Path:
        return self.dir / "mem"


def run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while piece := f.read(MIB):
            h.update(piece)
    return h.hexdigest()


def same_content(a: Path, b: Path) -> bool:
    """Byte equality, reading only where either file has data: outside the union of their
    data extents both are holes, i.e. zeros. (Hashing two 512 MiB files costs ~3 s.)"""
    if a.stat().st_size != b.stat().st_size:
        return False
    size = a.stat().st_size
    with open(a, "rb") as fa, open(b, "rb") as fb:
        spans = sorted(data_extents(fa.fileno(), size) + data_extents(fb.fileno(), size))
        for start, end in spans:
            for off in range(start, end, 8 * MIB):
                n = min(8 * MIB, end - off)
                if os.pread(fa.fileno(), n, off) != os.pread(fb.fileno(), n, off):
                    return False
    return True


def allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def make_base(path: Path, size: int = 64 * MIB) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
        for off in (0, 20 * MIB, size - MIB):
            f.seek(off)
            f.write(os.urandom(MIB))
    return path


def write_random(path: Path, regions: list[tuple[int, int]]) -> None:
    with open(path, "r+b") as f:
        for off, length in regions:
            f.seek(off)
            f.write(os.urandom(length))


def build_snapshot(
    root: Path, snapshot_id: str = "snap-1", base: Path | None = None
) -> BuiltSnapshot:
    root.mkdir(parents=True, exist_ok=True)
    base = base or make_base(root / "base.raw")
    layers_dir = root / "layers"
    layers_dir.mkdir(exist_ok=True)
    layers: list[Path] = []
    writes = [("0xab", "0", "1M"), ("0xcd", "4M", "2M"), ("0xef", "512k", "1M")]
    for i, (pattern, off, length) in enumerate(writes):
        layer = layers_dir / f"l{i}-{snapshot_id}.qcow2"
        below, fmt = (base, "raw") if not layers else (layers[-1], "qcow2")
        run("qemu-img", "create", "-q", "-f", "qcow2", "-b", str(below), "-F", fmt, str(layer))
        run("qemu-io", "-f", "qcow2", "-c", f"write -P {pattern} {off} {length}", str(layer))
        layers.append(layer)
    snap_dir = root / snapshot_id
    snap_dir.mkdir()
    (snap_dir / "state").write_bytes(os.urandom(64 * 1024))
    with open(snap_dir / "mem", "wb") as f:
        f.truncate(MEM_SIZE)
        f.seek(200 * MIB)
        f.write(bytes(4 * MIB))  # allocated but zero: must not be stored
    write_random(snap_dir / "mem", MEM_REGIONS)
    Snapshot(
        snapshot_id=snapshot_id,
        dir=snap_dir,
        machine=MACHINE,
        disk_top=layers[-1],
        base_image=base,
        runtime_disk=base,
        parent_vm="vm-1",
        state_bytes=64 * 1024,
    ).write()
    return BuiltSnapshot(snap_dir, base, layers)


def derive_snapshot(prev: BuiltSnapshot, snapshot_id: str) -> BuiltSnapshot:
    """The next snapshot of the same sandbox: same disk, RAM with one page changed."""
    snap_dir = prev.dir.parent / snapshot_id
    snap_dir.mkdir()
    (snap_dir / "state").write_bytes(os.urandom(64 * 1024))
    run("cp", "--sparse=always", str(prev.mem), str(snap_dir / "mem"))
    write_random(snap_dir / "mem", [(101 * MIB, 4096)])
    Snapshot(
        snapshot_id=snapshot_id,
        dir=snap_dir,
        machine=MACHINE,
        disk_top=prev.layers[-1],
        base_image=prev.base,
        runtime_disk=prev.base,
        parent_vm="vm-1",
        state_bytes=64 * 1024,
    ).write()
    return BuiltSnapshot(snap_dir, prev.base, prev.layers)
