"""What removing an entry frees: the blocks of the inodes all of whose links lie inside it
(issue 42). A file hard-linked elsewhere — an image's kernel linked from `kernel-*/`, a
chain's files linked into the next chain, a blob linked into a layout — stays when the
entry goes, so counting the entry's allocated bytes (`usage.allocated`) tells the budget
room was made that was not.

An entry's walk (`holding`) notes its own bytes and, for each inode it shares, its links
there and `st_nlink`. Across the listed entries (`attribute`), an inode whose every link
lies in listed entries is freed once all of them go: its bytes count for the holder the
plan takes last, so a plan's running sum is what its prefix frees (layer chains share
most of their files, and counting those for none would leave them unplannable). What is
linked from outside any entry (a kernel, a build's scratch) counts for none.

A write is charged the same way (`made`): a new image's link to the kernel's vmlinux, a
new chain's links to the older chain's files add nothing, so the ledger that subtracts
what removals truly free adds only what writes truly made.
"""

from __future__ import annotations

import stat
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from workers.node.disk.evict import Entry, order
from workers.node.disk.usage import Key, links

__all__ = ["Holding", "attribute", "holding", "made"]

_BLOCK = 512


@dataclass(frozen=True)
class Holding:
    """One entry's tree on disk: `own`, the bytes of inodes linked only from inside it;
    `shared`, each other inode's (bytes, links inside it, `st_nlink` when walked)."""

    own: int = 0
    shared: dict[Key, tuple[int, int, int]] = field(default_factory=dict)


def holding(path: Path) -> Holding:
    """Walk `path` (`du -x`, symlinks as themselves) and split its inodes by where their
    links lie. Directories cannot be hard-linked: always its own."""
    return _holding([path])


def made(paths: Iterable[Path]) -> int:
    """What a write that made `paths` added to the disk: the bytes of their inodes linked
    from nowhere else. A link to what was there before (a kernel's vmlinux in a new image,
    an older chain's files in the next chain) adds nothing."""
    return _holding(paths).own


def _holding(paths: Iterable[Path]) -> Holding:
    tops = sorted(set(paths))
    tops = [p for p in tops if not any(q in p.parents for q in tops)]  # each link once
    counts: Counter[Key] = Counter()
    stats = {}
    seen: set[Key] = set()
    for top in tops:
        for _, st, first in links(top, seen=seen):
            key = (st.st_dev, st.st_ino)
            counts[key] += 1
            if first:
                stats[key] = st
    own = 0
    shared: dict[Key, tuple[int, int, int]] = {}
    for key, st in stats.items():
        size = st.st_blocks * _BLOCK
        if stat.S_ISDIR(st.st_mode) or counts[key] >= st.st_nlink:
            own += size
        else:
            shared[key] = (size, counts[key], st.st_nlink)
    return Holding(own, shared)


def attribute(entries: list[Entry], holdings: Mapping[str, Holding]) -> list[Entry]:
    """The entries with `bytes` set to what the plan may count for each: its own bytes,
    plus those of inodes linked only from listed entries when it is the holder the plan
    takes last. A link count taken at another time than the others errs: the highest
    count seen is believed (a newer walk saw more links), and a removal returns what it
    really freed (`CacheEvictor.remove`), so a plan that counted too much is made again."""
    rank = {e.key: i for i, e in enumerate(order(entries))}
    size: dict[Key, int] = {}
    inside: Counter[Key] = Counter()
    nlink: dict[Key, int] = {}
    last: dict[Key, str] = {}
    for key, held in holdings.items():
        for ino, (nbytes, count, n) in held.shared.items():
            size[ino] = nbytes
            inside[ino] += count
            nlink[ino] = max(n, nlink.get(ino, 0))
            if ino not in last or rank.get(key, -1) > rank.get(last[ino], -1):
                last[ino] = key
    extra: Counter[str] = Counter()
    for ino, holder in last.items():
        if inside[ino] >= nlink[ino]:
            extra[holder] += size[ino]
    return [
        replace(e, bytes=holdings[e.key].own + extra[e.key]) if e.key in holdings else e
        for e in entries
    ]
