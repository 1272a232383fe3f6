"""The root disk: a raw ext4 file made straight from a tree with `mkfs.ext4 -d`.

Read-only by convention: every VM writes to its own qcow2 overlay on top of it (the
overlay takes the base's virtual size, `runtime/qcow2.py`), so the guest's root is as big
as this file. The file is sparse: its size is what the image holds plus the free space a
sandbox gets (`root_size`), and only the data costs host disk — mkfs writes no zeroed
journal or inode table (a fresh truncated file already reads as zeros).
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from .errors import ImageError

#: Free space a root disk keeps for its sandboxes beyond the image (pip installs, clones);
#: a node's default is `NodeSettings.image_free_bytes`, a template may ask for another.
DEFAULT_FREE = 8 << 30
BLOCK = 4096
#: An inode's own bytes in its table (mke2fs's default inode size).
INODE_BYTES = 256
#: The journal (64 MiB up to 16 GiB, 128 MiB up to 32 GiB), group descriptors, bitmaps and
#: the extent blocks of large files: a fixed allowance for everything not a file's data.
METADATA_ALLOWANCE = 128 << 20
#: mke2fs's default bytes-per-inode: a disk has size/16 KiB inodes, their tables take 1/64
#: of it, and a tree with more files than that needs more inodes (`-N`).
INODE_RATIO = 16384
_SIZE_STEP = 256 << 20
#: ext4 keeps a symlink target this short in the inode itself (no data block).
_FAST_SYMLINK = 60
#: mkfs's own clock (mkfs time, lost+found's and the root's crtime): fixed, so that two
#: runs over one untouched tree give the same bytes (only E2FSPROGS_FAKE_TIME does it in
#: e2fsprogs 1.47; SOURCE_DATE_EPOCH is ignored).
FAKE_TIME = 1_700_000_000


def parse_size(text: str) -> int:
    """`2G`, `512M`, `1536m`, `2147483648` → bytes."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    try:
        if t and t[-1] in units:
            return int(float(t[:-1]) * units[t[-1]])
        return int(t)
    except ValueError as e:
        raise ImageError(f"bad size {text!r} (use e.g. 2G or 512M)") from e


def _roundup(n: int, step: int) -> int:
    return -(-n // step) * step


def _entries(tree: Path) -> list[os.stat_result]:
    """One stat per inode under `tree`, the root included (a hard link counted once;
    symlinks not followed)."""
    seen: dict[tuple[int, int], os.stat_result] = {}
    root = os.lstat(tree)
    seen[(root.st_dev, root.st_ino)] = root
    for dirpath, dirs, files in os.walk(tree):
        for name in (*dirs, *files):
            with contextlib.suppress(OSError):  # vanished while walking
                st = os.lstat(os.path.join(dirpath, name))
                seen.setdefault((st.st_dev, st.st_ino), st)
    return list(seen.values())


def _data_bytes(st: os.stat_result) -> int:
    """What one inode's data takes in ext4: whole 4 KiB blocks, at most what the source
    really allocates (mkfs -d keeps holes and skips zero blocks)."""
    if stat.S_ISLNK(st.st_mode):
        return 0 if st.st_size < _FAST_SYMLINK else BLOCK
    if stat.S_ISDIR(st.st_mode):
        return max(BLOCK, _roundup(st.st_size, BLOCK))
    if stat.S_ISREG(st.st_mode):
        return min(_roundup(st.st_size, BLOCK), _roundup(st.st_blocks * 512, BLOCK))
    return 0  # devices, fifos, sockets: an inode only


@dataclass(frozen=True)
class Census:
    """What a tree asks of an ext4: bytes before any free space (`need`) and inodes."""

    need: int
    inodes: int


def census(tree: Path) -> Census:
    """One walk of `tree`: each inode once (hard links share one) with its data in whole
    blocks and its 256 B table entry, plus the journal and metadata allowance. Replaces
    the old guess (apparent size times 1.2), which counted hard links as often as they are
    named and a sparse file at its full length."""
    entries = _entries(tree)
    data = sum(_data_bytes(st) for st in entries)
    return Census(data + len(entries) * INODE_BYTES + METADATA_ALLOWANCE, len(entries))


def need_bytes(tree: Path) -> int:
    """Bytes an ext4 holding `tree` needs before any free space (`census`)."""
    return census(tree).need


def root_size(need: int, free: int) -> int:
    """The disk size that holds `need` (from `need_bytes`) and still leaves `free` bytes
    free in the guest (`df /`): 5 % slack on the tree, the inode tables (1/64 of the
    disk) and bitmaps that grow with the disk, in 256 MiB steps."""
    if need < 0 or free < 0:
        raise ImageError(f"bad disk sizes: need {need}, free {free}")
    wanted = int(need * 1.05) + free
    return _roundup(-(-wanted * 64 // 62), _SIZE_STEP)


def make_ext4(
    tree: Path,
    out: Path,
    size: int,
    *,
    label: str = "root",
    fs_uuid: uuid.UUID | None = None,
    fake_time: int | None = FAKE_TIME,
    counted: Census | None = None,
) -> None:
    """Create `out` (sparse, `size` bytes) holding `tree` as an ext4 filesystem.

    Inode tables are initialised now (`lazy_itable_init=0`) so that the guest kernel does
    not zero them in the background on every boot; the journal is not written
    (`lazy_journal_init=1`): the truncated file already reads as zeros, and writing them
    would only allocate host disk. No blocks are reserved for root (`-m 0`): the free space
    is the sandbox's, whoever its user is. `fs_uuid` (from the recipe digest) is both the
    filesystem's UUID and its directory hash seed; with `fake_time` two builds of one
    untouched tree give the same bytes — a nicety, nothing relies on it. `counted`: the
    tree's census if the caller took it already (to size the disk).
    """
    counted = counted or census(tree)
    need = counted.need
    if need > size:
        raise ImageError(
            f"rootfs tree needs ~{need >> 20} MiB; disk size {size >> 20} MiB is too small"
        )
    fs_uuid = fs_uuid or uuid.uuid4()
    extended = f"hash_seed={fs_uuid},lazy_itable_init=0,lazy_journal_init=1"
    with out.open("wb") as f:
        f.truncate(size)
    argv = ["mkfs.ext4", "-q", "-F", "-L", label, "-m", "0", "-U", str(fs_uuid), "-E", extended]
    inodes = counted.inodes
    if inodes * 5 // 4 > size // INODE_RATIO:  # many small files: more inodes than usual
        argv += ["-N", str(inodes * 5 // 4 + 1024)]
    env = dict(os.environ)
    if fake_time is not None:
        env["E2FSPROGS_FAKE_TIME"] = str(fake_time)
    try:
        proc = subprocess.run(
            [*argv, "-d", str(tree), str(out)], capture_output=True, text=True, env=env, check=False
        )
    except FileNotFoundError as e:
        raise ImageError("mkfs.ext4 not found (apt-get install e2fsprogs)") from e
    if proc.returncode != 0:
        raise ImageError(f"mkfs.ext4 failed ({proc.returncode}): {proc.stderr.strip()[-300:]}")


def disk_uuid(digest: str) -> uuid.UUID:
    """A disk's filesystem UUID (and hash seed) from its recipe digest (hex)."""
    return uuid.UUID(digest[:32])
