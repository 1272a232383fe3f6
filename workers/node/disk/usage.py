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
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePath

from workers.node.disk.categories import CATEGORIES, Category, RootKind, category_of

__all__ = ["Key", "Tally", "allocated", "links", "scan"]

_BLOCK = 512  # st_blocks' unit, whatever the filesystem's block size

#: an inode: (st_dev, st_ino)
Key = tuple[int, int]


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
    seen: set[Key] = set()
    out = dict.fromkeys(CATEGORIES, 0)
    for kind, path in roots:
        for rel, st, first in links(path, seen=seen, skip=nested, follow_top=True):
            if first:
                out[category_of(kind, rel)] += st.st_blocks * _BLOCK
    return Tally(out)


def allocated(path: Path) -> int:
    """Bytes a file or tree allocates (`du -x`: each inode once, symlinks as themselves)."""
    return sum(st.st_blocks * _BLOCK for _, st, first in links(path) if first)


def links(
    top: Path,
    *,
    seen: set[Key] | None = None,
    skip: Collection[Key] = (),
    follow_top: bool = False,
) -> Iterator[tuple[PurePath, os.stat_result, bool]]:
    """Every name under `top` (itself first, as `PurePath()`), with its lstat and whether
    its inode is met here first (`seen`, shared by the caller across walks, says what was
    met before). Depth first in name order; a directory is entered on first sight only;
    nothing on another filesystem than `top`'s (`du -x`), nor in `skip` (roots walked as
    themselves); symlinks are names, never followed (`top` itself if `follow_top`)."""
    seen = set() if seen is None else seen
    try:
        top_st = os.stat(top) if follow_top else os.lstat(top)
    except OSError:
        return
    first = _key(top_st) not in seen
    seen.add(_key(top_st))
    yield PurePath(), top_st, first
    if not first or not stat.S_ISDIR(top_st.st_mode):
        return
    stack: list[tuple[Path, PurePath]] = [(top, PurePath())]
    while stack:
        here, rel = stack.pop()
        subdirs = []
        for name, st in _entries(here):
            key = _key(st)
            if st.st_dev != top_st.st_dev or key in skip:
                continue
            first = key not in seen
            seen.add(key)
            yield rel / name, st, first
            if first and stat.S_ISDIR(st.st_mode):
                subdirs.append((here / name, rel / name))
        stack.extend(reversed(subdirs))  # depth first, in name order


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


def _key(st: os.stat_result) -> Key:
    return st.st_dev, st.st_ino
