"""The root disk: a raw ext4 file made straight from a tree with `mkfs.ext4 -d`.

Read-only by convention: every VM writes to its own qcow2 overlay on top of it. The file
is sparse, so the nominal size (default 2 GiB, the sandbox's disk size) costs only what
the tree occupies.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

from .errors import ImageError

DEFAULT_SIZE = 2 << 30


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


def tree_bytes(tree: Path) -> int:
    """Apparent size of the files in a tree, without following symlinks."""
    total = 0
    for dirpath, _dirs, files in os.walk(tree):
        for f in files:
            with contextlib.suppress(OSError):  # vanished while walking
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return total


def make_ext4(tree: Path, out: Path, size: int, *, label: str = "root") -> None:
    """Create `out` (sparse, `size` bytes) holding `tree` as an ext4 filesystem.

    Inode tables and the journal are initialised now (`lazy_*_init=0`) so that the guest
    kernel does not zero them in the background on every boot.
    """
    need = tree_bytes(tree)
    if need * 1.2 + (64 << 20) > size:
        raise ImageError(
            f"rootfs tree needs ~{need >> 20} MiB; disk size {size >> 20} MiB is too small"
        )
    with out.open("wb") as f:
        f.truncate(size)
    argv = [
        "mkfs.ext4",
        "-q",
        "-F",
        "-L",
        label,
        "-E",
        "lazy_itable_init=0,lazy_journal_init=0",
        "-d",
        str(tree),
        str(out),
    ]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    except FileNotFoundError as e:
        raise ImageError("mkfs.ext4 not found (apt-get install e2fsprogs)") from e
    if proc.returncode != 0:
        raise ImageError(f"mkfs.ext4 failed ({proc.returncode}): {proc.stderr.strip()[-300:]}")
