"""The node-local blob cache: downloads land here first, so a blob is fetched once per node.

Resuming many sandboxes of one template, or the same sandbox twice, pulls the shared
layers and memory chunks from S3 only the first time. A byte budget bounds the directory;
least-recently-used blobs go first. Recency is the file's mtime (touched on every hit), so
the index survives a node restart with no extra file to keep consistent. Blobs a download
is still using are pinned: the budget may be exceeded for the duration, never a live file
deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from workers.snapshot import paths


@dataclass(frozen=True)
class CacheEntry:
    size: int
    last_used: float


def plan_eviction(
    entries: Mapping[str, CacheEntry], budget: int, protected: Iterable[str] = ()
) -> list[str]:
    """Digests to evict, least recently used first, until the rest fits `budget`.

    Protected entries are never chosen; if they alone exceed the budget, everything else
    goes and the cache stays over budget until they are released.
    """
    keep = set(protected)
    total = sum(e.size for e in entries.values())
    out: list[str] = []
    for digest, entry in sorted(entries.items(), key=lambda kv: (kv[1].last_used, kv[0])):
        if total <= budget:
            break
        if digest in keep:
            continue
        out.append(digest)
        total -= entry.size
    return out


class BlobCache:
    """A directory of verified blobs, named by digest, under a byte budget."""

    def __init__(self, root: Path, budget_bytes: int | Callable[[], int]):
        self.root = root
        #: a number, or asked at each trim (the node's disk budget gives it what is free)
        self.budget = budget_bytes
        self._entries: dict[str, CacheEntry] = {}
        self._pins: Counter[str] = Counter()
        self._loading: dict[str, asyncio.Lock] = {}
        root.mkdir(parents=True, exist_ok=True)
        self._scan()

    def _scan(self) -> None:
        for dirpath, _, files in os.walk(self.root):
            for name in files:
                p = Path(dirpath) / name
                if name.startswith("."):  # a download cut short by a crash
                    p.unlink(missing_ok=True)
                    continue
                digest = paths.digest_from_key(p.relative_to(self.root).as_posix())
                if digest is not None:
                    st = p.stat()
                    self._entries[digest] = CacheEntry(st.st_size, st.st_mtime)

    def path_for(self, digest: str) -> Path:
        return self.root / paths.blob_key(digest)

    @property
    def used_bytes(self) -> int:
        return sum(e.size for e in self._entries.values())

    def __contains__(self, digest: object) -> bool:
        return digest in self._entries

    def get(self, digest: str) -> Path | None:
        """The cached blob's path (marking it recently used), or None."""
        entry = self._entries.get(digest)
        if entry is None:
            return None
        path = self.path_for(digest)
        now = time.time()
        try:
            os.utime(path, (now, now))
        except FileNotFoundError:  # removed behind our back: treat as a miss
            del self._entries[digest]
            return None
        self._entries[digest] = CacheEntry(entry.size, now)
        return path

    async def fetch(self, digest: str, load: Callable[[Path], Awaitable[int]]) -> Path:
        """The blob's cached path, calling `load(path)` to fill it on a miss.

        `load` must write `path` atomically (the stores' `get_blob_to` does). Concurrent
        fetches of one digest load it once.
        """
        lock = self._loading.setdefault(digest, asyncio.Lock())
        try:
            async with lock:
                hit = self.get(digest)
                if hit is not None:
                    return hit
                path = self.path_for(digest)
                size = await load(path)
                self._entries[digest] = CacheEntry(size, time.time())
        finally:
            if not lock.locked() and self._loading.get(digest) is lock:
                del self._loading[digest]
        self.trim()
        return path

    @contextlib.contextmanager
    def hold(self, digests: Iterable[str]) -> Iterator[None]:
        """Pin `digests` against eviction for the duration (a download in progress)."""
        held = list(set(digests))
        self._pins.update(held)
        try:
            yield
        finally:
            self._pins.subtract(held)
            self._pins += Counter()  # drop zero counts
            self.trim()

    def drop(self, path: Path) -> bool:
        """Remove the blob at `path` for the node's disk budget, unless a download holds it
        (False: kept). Called from the budget's thread: one dict update each."""
        digest = paths.digest_from_key(path.relative_to(self.root).as_posix())
        if digest is None or self._pins.get(digest, 0) > 0:
            return False
        path.unlink(missing_ok=True)
        self._entries.pop(digest, None)
        return True

    def trim(self) -> list[str]:
        """Evict least-recently-used unpinned blobs until within budget; returns them."""
        budget = self.budget() if callable(self.budget) else self.budget
        victims = plan_eviction(self._entries, budget, self._pins.keys())
        for digest in victims:
            self.path_for(digest).unlink(missing_ok=True)
            del self._entries[digest]
        return victims
