"""How many bytes a node's disk holds, by category: one walk of its roots.

Counts what the filesystem allocated (`st_blocks * 512`, as `du` does), not file sizes:
RAM files and root disks are sparse, and their apparent size says little about the disk.
Each inode counts once (`(st_dev, st_ino)`): layer chains, kernels and staging trees are
hard links of one another. Symlinks are counted as themselves, never followed, and the
walk stays on each root's filesystem (`du -x`): a build's scratch may have /proc mounted
in it. A root inside another root is walked as itself, not as part of the outer one.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePath

from workers.node.disk.categories import CATEGORIES, Category, RootKind, category_of

__all__ = ["Tally", "scan"]

_BLOCK = 512  # st_blocks' unit, whatever the filesystem's block size


@dataclass(frozen=True)
class Tally:
    """Allocated bytes by category (every category present, zeros included)."""

    bytes: dict[Category, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))

    @property
    def total(self) -> int:
        return sum(self.bytes.values())


def scan(roots: Iterable[tuple[RootKind, Path]]) -> Tally:
    """Walk each root (a missing one holds nothing) and add up what it allocates.

    An inode seen twice is counted under the category where the walk met it first; the
    walk goes in root order and sorted name order, so the answer does not depend on
    directory order."""
    roots = [(kind, path) for kind, path in roots if path.is_dir()]
    nested = {_key(os.stat(path)) for _, path in roots}
    seen: set[tuple[int, int]] = set()
    out = dict.fromkeys(CATEGORIES, 0)
    for kind, path in roots:
        top = os.stat(path)
        if _key(top) in seen:
            continue  # the same root twice, or one already walked inside another
        seen.add(_key(top))
        out["other"] += top.st_blocks * _BLOCK
        stack: list[tuple[Path, PurePath]] = [(path, PurePath())]
        while stack:
            here, rel = stack.pop()
            subdirs = []
            for name, st in _entries(here):
                key = _key(st)
                if key in seen or st.st_dev != top.st_dev or key in nested:
                    continue
                seen.add(key)
                sub = rel / name
                out[category_of(kind, sub)] += st.st_blocks * _BLOCK
                if stat.S_ISDIR(st.st_mode):
                    subdirs.append((here / name, sub))
            stack.extend(reversed(subdirs))  # depth first, in name order
    return Tally(out)


def _entries(directory: Path) -> list[tuple[str, os.stat_result]]:
    """The directory's entries with their lstat, sorted by name; what vanished or cannot
    be read meanwhile is left out (the walk runs beside builds and VMs that change it)."""
    try:
        with os.scandir(directory) as it:
            names = sorted(e.name for e in it)
    except OSError:
        return []
    out = []
    for name in names:
        try:
            out.append((name, os.lstat(directory / name)))
        except OSError:
            continue
    return out


def _key(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino
