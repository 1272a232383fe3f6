"""What to evict to free `need` bytes: a pure plan over the node's disk entries
(images-at-scale S8), so the order is tested without a disk.

Regenerable caches go first, in a fixed order of how cheap they are to make again (layer
chains are re-unpacked from blobs, RAM copies re-read, blobs re-pulled, debootstrap trees
rebuilt, repository blobs re-downloaded), each least recently used first. Then durable
entries, least recently used first across kinds: images and runtime disks (fetched back
by content from the repository) and captures already uploaded (pulled back on the next
create). Never: running VMs, their top layers, captures not yet uploaded, volumes, build
scratch, kernels and small records — losing them loses data or breaks what runs.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from workers.node.disk.categories import Category

__all__ = ["DURABLE", "REGENERABLE", "Entry", "Plan", "evictable", "order", "plan"]

#: evicted first, in this order (each least recently used first)
REGENERABLE: tuple[Category, ...] = ("chain", "ram_pool", "oci_blob", "rootfs_tree", "blob_cache")
#: evicted next, least recently used first across these kinds
DURABLE: tuple[Category, ...] = ("image", "runtime", "capture")


@dataclass(frozen=True)
class Entry:
    """One thing the evictor can remove as a whole (a cache entry's directory, a blob, a
    capture), and what it costs on disk."""

    key: str  # its path (a capture: its snapshot id), unique among the entries
    category: Category
    bytes: int
    last_used: float  # a stamp (mtime, `DiskBudget.touch`): older goes first
    #: a capture only: whether the repository holds it (else it is the only copy)
    uploaded: bool = True
    #: keys of other entries it stands on (a capture over its base image): those stay
    #: until this one goes
    holds: tuple[str, ...] = ()


@dataclass(frozen=True)
class Plan:
    """The entries to remove, in order, and what they free; `enough`: whether they free
    `need` (if not, nothing should be removed: it would not help)."""

    evict: tuple[Entry, ...]
    freed: int
    evictable: int
    enough: bool


def evictable(entry: Entry) -> bool:
    """Whether this kind of entry may ever be evicted (pins aside)."""
    if entry.category == "capture":
        return entry.uploaded
    return entry.category in REGENERABLE or entry.category in DURABLE


def order(entries: Iterable[Entry]) -> list[Entry]:
    """Every evictable kind of entry in the order plans take them (pins and holds aside)."""
    regenerable = sorted(
        (e for e in entries if e.category in REGENERABLE),
        key=lambda e: (REGENERABLE.index(e.category), e.last_used, e.key),
    )
    durable = sorted(
        (e for e in entries if e.category in DURABLE), key=lambda e: (e.last_used, e.key)
    )
    return regenerable + durable


def plan(entries: Collection[Entry], need: int, pins: Collection[str] = ()) -> Plan:
    """The shortest prefix of the eviction order that frees `need` bytes.

    `pins`: keys in use (a running or warm VM's image, a build's blobs): never chosen.
    An entry another entry `holds` is chosen only once every holder was chosen before it
    (a capture's base image after the capture; a base image under a capture that stays,
    never). `evictable` counts everything that could go, so the caller can say how far
    short a write is."""
    pinned = set(pins)
    holders: dict[str, int] = {}
    for e in entries:
        for held in e.holds:
            holders[held] = holders.get(held, 0) + 1
    candidates = [e for e in order(entries) if evictable(e) and e.key not in pinned]
    chosen: list[Entry] = []
    freed = 0
    waiting = list(candidates)
    progressed = True
    while freed < need and progressed:
        progressed = False
        for e in waiting:
            if holders.get(e.key, 0) > 0:
                continue  # still stood on: after its holders, or never
            chosen.append(e)
            freed += e.bytes
            for held in e.holds:
                holders[held] -= 1
            waiting.remove(e)
            progressed = True
            break  # restart: a holder gone may free an earlier entry in the order
    total = freed + _releasable(waiting, holders)
    enough = freed >= need
    return Plan(tuple(chosen) if enough else (), freed if enough else 0, total, enough)


def _releasable(waiting: list[Entry], holders: dict[str, int]) -> int:
    """Bytes of the entries not chosen that could still go if every holder went too."""
    left = dict(holders)
    out = 0
    changed = True
    rest = list(waiting)
    while changed:
        changed = False
        for e in list(rest):
            if left.get(e.key, 0) == 0:
                out += e.bytes
                for held in e.holds:
                    left[held] -= 1
                rest.remove(e)
                changed = True
    return out
