"""A lazily held base image (issue 29): what the node and the snapshot worker both must
recognise as "the base" of a disk chain.

A node that never held an image's disk keeps, in the image's cache entry, a tiny qcow2
`root.lazy.qcow2` (no data) whose backing is the node's block service over NBD: QEMU reads
the image's blocks through it, fetched from the repository on first read. Everything that
treats the base as a local path (top layers created over it, a capture's chain walked for
its upload, a chain rebuilt on download, layer GC) must stop at this stub as it stops at a
raw `root.ext4`: the stub is the base, never a layer — never uploaded, never part of what
a capture names (`SnapshotManifest.base_image` names the image by content, as for a raw
base), and its size is the image's (the qcow2 header's virtual size), not its file's.

Why a stub rather than the NBD spec as the bottom layer's backing: every place that holds
the base as a `Path` (`Snapshot.base_image`, the evictor's in-use check, a capture's
manifest) keeps working, and QEMU holds the stub open while it runs, which is exactly what
the disk budget's "in use" looks for.

Header reads are in-process (a few bytes): `qemu-img info --backing-chain` would open the
NBD export itself (a connection per layer GC, and a failure whenever the service restarts).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Literal

__all__ = [
    "LAZY_ROOT",
    "QCOW2_MAGIC",
    "RECONNECT_DELAY_S",
    "base_format",
    "base_size",
    "chain_to_base",
    "is_lazy_base",
    "nbd_backing",
    "qcow2_backing",
]

#: The stub's name in a cache entry (`images/<content>/root.lazy.qcow2`).
LAZY_ROOT = "root.lazy.qcow2"
#: How long QEMU holds a guest's reads while the block service is away (its NBD client's
#: `reconnect-delay`); then they fail as I/O errors. The node's supervisor uses the same
#: window: a service not back within it has its VMs ended (`workers/node/blockoutage.py`).
RECONNECT_DELAY_S = 30
QCOW2_MAGIC = b"QFI\xfb"
_EXT_BACKING_FORMAT = 0xE2792ACA
_V2_HEADER_LEN = 72
#: A longer chain is a loop or a bug (the node compacts at 16 layers).
MAX_DEPTH = 64
#: How a stub's backing names the block service (a `json:` spec: QEMU 7.2's NBD options).
_SPEC_PREFIX = "json:"


def nbd_backing(
    socket: Path,
    export: str,
    *,
    reconnect_delay_s: int = RECONNECT_DELAY_S,
    open_timeout_s: int = 10,
) -> str:
    """The backing name of a stub: raw bytes over NBD on the block service's unix socket,
    export = the image's content digest. `reconnect_delay_s`: how long QEMU holds a guest's
    reads while the service restarts (then they fail as I/O errors, never hang);
    `open_timeout_s`: how long a VM start waits for the service to answer at all.

    QEMU 7.2 takes `{"driver":"nbd",...}` with a raw backing format only nested as the raw
    driver's `file` (at the top level it asks for a block device)."""
    spec = {
        "driver": "raw",
        "file": {
            "driver": "nbd",
            "server": {"type": "unix", "path": str(socket)},
            "export": export,
            "reconnect-delay": reconnect_delay_s,
            "open-timeout": open_timeout_s,
        },
    }
    return _SPEC_PREFIX + json.dumps(spec, separators=(",", ":"))


def qcow2_backing(path: Path) -> tuple[str | None, str | None] | None:
    """(backing name, backing format) of a qcow2 file (either None: not stated), or None
    if `path` is not a qcow2 file at all (a raw base)."""
    with open(path, "rb") as f:
        head = f.read(4096)
        if head[:4] != QCOW2_MAGIC:
            return None
        version, off, length = struct.unpack(">IQI", head[4:20])
        name: str | None = None
        if off and length:
            f.seek(off)
            name = f.read(length).decode()
    fmt: str | None = None
    pos = int(struct.unpack(">I", head[100:104])[0]) if version >= 3 else _V2_HEADER_LEN
    while pos + 8 <= len(head):
        kind, size = struct.unpack(">II", head[pos : pos + 8])
        if kind == 0:
            break
        if kind == _EXT_BACKING_FORMAT:
            fmt = head[pos + 8 : pos + 8 + size].decode()
        pos += 8 + size + (-size % 8)
    return name, fmt


def is_lazy_base(path: Path) -> bool:
    """Whether `path` is a lazy base's stub: a qcow2 backed by an NBD spec."""
    try:
        found = qcow2_backing(path)
    except OSError:
        return False
    return found is not None and _is_spec(found[0])


def _is_spec(name: str | None) -> bool:
    return name is not None and name.startswith(_SPEC_PREFIX) and '"nbd"' in name


def base_format(path: Path) -> Literal["raw", "qcow2"]:
    """The format a layer sitting directly on the base `path` names for it."""
    return "qcow2" if is_lazy_base(path) else "raw"


def base_size(path: Path) -> int:
    """The guest-visible size of a base: a raw file's size, a stub's virtual size."""
    if not is_lazy_base(path):
        return os.stat(path).st_size
    with open(path, "rb") as f:
        head = f.read(32)
    return int(struct.unpack(">Q", head[24:32])[0])


def chain_to_base(top: Path) -> list[Path]:
    """`top`, every qcow2 layer under it and the base last (a raw file or a stub), read from
    the headers as QEMU resolves them (a relative name against the layer's directory)."""
    out = [top]
    while len(out) <= MAX_DEPTH:
        try:
            found = qcow2_backing(out[-1])
        except FileNotFoundError:  # gone (an evicted base): the chain as far as it goes
            return out
        if found is None or found[0] is None or _is_spec(found[0]):
            return out  # a raw file, a qcow2 on nothing, or a stub: the base
        below = Path(found[0])
        out.append(below if below.is_absolute() else out[-1].parent / below)
    raise ValueError(f"backing chain of {top} is deeper than {MAX_DEPTH}")
