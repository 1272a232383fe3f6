"""Write an empty qcow2 v3 overlay in-process (no `qemu-img` exec on the restore path).

`qemu-img create -b` costs ~15 ms of process start per sandbox; the file it writes is a
fixed, tiny structure: a header naming the backing file, one refcount table cluster, one
refcount block, and a zeroed L1 table. Writing that directly takes microseconds.
`tests/integration/runtime/test_layers.py` checks our files with `qemu-img check` and
against what `qemu-img info` reads back.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

CLUSTER_BITS = 16
CLUSTER = 1 << CLUSTER_BITS
MAGIC = b"QFI\xfb"
HEADER_LEN = 104  # the v3 header without the optional compression-type field
EXT_BACKING_FORMAT = 0xE2792ACA
REFCOUNT_ORDER = 4  # 16-bit refcounts, qemu's default
MAX_BACKING_NAME = 1023  # qemu's limit on a backing file name


class Qcow2Error(Exception):
    pass


def virtual_size(path: Path, fmt: str) -> int:
    """Guest-visible size of a raw or qcow2 image."""
    if fmt == "raw":
        return os.stat(path).st_size
    with open(path, "rb") as f:
        head = f.read(32)
    if head[:4] != MAGIC:
        raise Qcow2Error(f"{path} is not a qcow2 image")
    return int(struct.unpack(">Q", head[24:32])[0])


def _pad8(b: bytes) -> bytes:
    return b + b"\0" * (-len(b) % 8)


def create_overlay(path: Path, backing: Path, backing_fmt: str) -> None:
    """An empty qcow2 whose every read falls through to `backing` (absolute path)."""
    if backing_fmt not in ("raw", "qcow2"):
        raise Qcow2Error(f"unsupported backing format {backing_fmt!r}")
    write_overlay(path, str(backing), backing_fmt, virtual_size(backing, backing_fmt))


def write_overlay(path: Path, backing: str, backing_fmt: str, size: int) -> None:
    """An empty qcow2 of `size` bytes over the backing named `backing` (a path, or a
    `json:` spec QEMU opens: a lazy base's stub over the block service)."""
    name = backing.encode()
    l2_entries = CLUSTER // 8
    l1_size = -(-size // (CLUSTER * l2_entries))
    l1_clusters = max(1, -(-(l1_size * 8) // CLUSTER))
    refcount_table_off, refcount_block_off, l1_off = CLUSTER, 2 * CLUSTER, 3 * CLUSTER
    n_clusters = 3 + l1_clusters

    fmt_ext = _pad8(backing_fmt.encode())
    exts = struct.pack(">II", EXT_BACKING_FORMAT, len(backing_fmt)) + fmt_ext
    exts += struct.pack(">II", 0, 0)  # end of header extensions
    backing_off = HEADER_LEN + len(exts)
    if backing_off + len(name) > CLUSTER or len(name) > MAX_BACKING_NAME:
        raise Qcow2Error(f"backing path too long: {backing}")
    header = MAGIC + struct.pack(
        ">IQIIQIIQQIIQQQQII",
        3,  # version
        backing_off,
        len(name),
        CLUSTER_BITS,
        size,
        0,  # crypt method
        l1_size,
        l1_off,
        refcount_table_off,
        1,  # refcount table clusters
        0,  # snapshots
        0,  # snapshots offset
        0,  # incompatible features
        0,  # compatible features
        0,  # autoclear features
        REFCOUNT_ORDER,
        HEADER_LEN,
    )
    assert len(header) == HEADER_LEN
    first = header + exts + name
    refcount_table = struct.pack(">Q", refcount_block_off)
    refcount_block = struct.pack(">H", 1) * n_clusters
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(first)
        f.seek(refcount_table_off)
        f.write(refcount_table)
        f.seek(refcount_block_off)
        f.write(refcount_block)
        f.truncate(n_clusters * CLUSTER)  # the L1 table is all zeroes: unallocated
    os.replace(tmp, path)
