"""The block service's chunk cache: image chunks by digest, on the node's disk, LRU by bytes.

One file per chunk, `<root>/chunks/<2 hex>/<sha256>`, shared by every export: two images
with a chunk in common store and fetch it once. A chunk is fetched from the repository into
`<root>/chunks/.tmp/`, hashed, and only then renamed into place, so a named file is always
the bytes of its name (the store verifies too; this cache answers for itself, as an image
download does). Concurrent reads of a missing chunk fetch it once (single flight).

Eviction is least recently used by bytes, down to the cap, never a chunk a read holds at
that moment (`hold`): the cap may be exceeded by what in-flight reads pin. Recency lives in
memory; at start the files' mtimes (their placement time) order what a restart found.

A chunk read often keeps its file open (`open_fd`): at most `max_fds` descriptors, the least
recently used closed first, never one a held read may be using, and a chunk's is closed
when the chunk is evicted (so no descriptor outlives its file's place in the cache).

Fetches are demand fetches (a read waits for them: `get`) or ahead of reads (readahead's
`prefetch`, a trace's `fetch_ahead`); a trace's prefetch sizes itself by the demand fetches
in flight (`demand_flights`) and stops before it would evict what was used just now
(`room_for`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import os
import resource
import shutil
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from workers.snapshot.digest import file_digest
from workers.snapshot.errors import CorruptBlob
from workers.snapshot.retry import RetryPolicy, retrying
from workers.snapshot.store import SnapshotStore

__all__ = ["MAX_FDS", "CacheCounters", "ChunkCache"]

log = logging.getLogger(__name__)

#: Chunk files kept open at most: 1 GiB of 4 MiB chunks, a working set of random reads;
#: further below the process's descriptor limit (`open_fd_limit`) when that is low.
MAX_FDS = 256


def open_fd_limit(wanted: int = MAX_FDS) -> int:
    """`wanted`, or a quarter of the soft RLIMIT_NOFILE if that is less (sockets, the
    store's connections and fetches need the rest)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft // 4))


@dataclass
class CacheCounters:
    """Cumulative since start (a restart starts them afresh; the node sums restarts)."""

    hits: int = 0
    misses: int = 0
    bytes_fetched: int = 0
    fetch_seconds_total: float = 0.0
    evictions: int = 0
    fetch_errors: int = 0
    prefetches: int = 0  # fetches started by readahead (counted in misses too)


class ChunkCache:
    """Verified chunk files under a byte cap, filled from a `SnapshotStore` on a miss."""

    def __init__(
        self,
        root: Path,
        store: SnapshotStore,
        cap_bytes: int,
        *,
        retry: RetryPolicy | None = None,
        max_fds: int | None = None,
    ):
        self.dir = root / "chunks"
        self.store = store
        self.cap_bytes = cap_bytes
        self.retry = retry or RetryPolicy()
        self.counters = CacheCounters()
        self._tmp = self.dir / ".tmp"
        self._lru: OrderedDict[str, int] = OrderedDict()  # digest -> size, oldest first
        self._bytes = 0
        self._pins: Counter[str] = Counter()
        self._flights: dict[str, asyncio.Task[Path]] = {}
        self._demand: set[str] = set()  # the flights a read started (and waits for)
        self._used: dict[str, float] = {}  # digest -> when last read or placed (monotonic)
        self._names = itertools.count()
        #: open chunk files, digest -> descriptor, least recently used first
        self._fds: OrderedDict[str, int] = OrderedDict()
        self.max_fds = open_fd_limit() if max_fds is None else max_fds
        shutil.rmtree(self._tmp, ignore_errors=True)  # fetches cut short by a crash
        self._tmp.mkdir(parents=True, exist_ok=True)
        self._scan()

    def _scan(self) -> None:
        found: list[tuple[float, str, int]] = []
        for sub in self.dir.iterdir():
            if sub.name.startswith(".") or not sub.is_dir():
                continue
            for f in sub.iterdir():
                st = f.stat()
                found.append((st.st_mtime, f.name, st.st_size))
        for _, digest, size in sorted(found):
            self._lru[digest] = size
            self._bytes += size
        self._evict()

    @property
    def cached_bytes(self) -> int:
        return self._bytes

    @property
    def cached_chunks(self) -> int:
        return len(self._lru)

    def set_cap(self, cap_bytes: int) -> None:
        """A new cap (the node's disk budget changed): a lower one evicts down to it now."""
        self.cap_bytes = cap_bytes
        self._evict()

    @property
    def open_fds(self) -> int:
        return len(self._fds)

    def path_for(self, digest: str) -> Path:
        return self.dir / digest[:2] / digest

    def open_fd(self, digest: str) -> int | None:
        """A descriptor of the chunk's file, opened once and kept, if the chunk is here;
        else None. Not a hit by itself (a read that uses it says `hit`). The descriptor is
        valid until control returns to the loop, or, while the caller holds `digest`,
        until it lets go: only then may eviction or `max_fds` close it. A file gone from
        under the cache (deleted by hand) makes the chunk missing, to be fetched again."""
        fd = self._fds.get(digest)
        if fd is not None:
            self._fds.move_to_end(digest)
            return fd
        if digest not in self._lru:
            return None
        try:
            fd = os.open(self.path_for(digest), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            log.warning("chunk %s: its file is gone; fetched again when read", digest)
            self._bytes -= self._lru.pop(digest)
            self._used.pop(digest, None)
            return None
        self._fds[digest] = fd
        if len(self._fds) > self.max_fds:
            self._trim_fds()
        return fd

    def hit(self, digest: str) -> None:
        """A read was served from the cached chunk `digest`: now the most recently used."""
        self._lru.move_to_end(digest)
        self._used[digest] = time.monotonic()
        self.counters.hits += 1

    def _trim_fds(self) -> None:
        for digest in list(self._fds):
            if len(self._fds) <= self.max_fds:
                break
            if self._pins.get(digest, 0) <= 0:
                os.close(self._fds.pop(digest))

    def _close_fd(self, digest: str) -> None:
        fd = self._fds.pop(digest, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        """Close every kept descriptor (the service stops)."""
        while self._fds:
            os.close(self._fds.popitem()[1])

    @contextlib.contextmanager
    def hold(self, digests: list[str]) -> Iterator[None]:
        """Pin `digests` against eviction while a read uses their files."""
        self._pins.update(digests)
        try:
            yield
        finally:
            self._pins.subtract(digests)
            for d in digests:
                if self._pins[d] <= 0:
                    del self._pins[d]
            self._evict()  # what pins kept over the cap goes now, not at the next fetch

    def cached(self, digest: str) -> Path | None:
        """The chunk's file if it is here (a hit: now the most recently used), else None;
        no await, so a read whose chunks are all here never yields to the loop for them."""
        if digest not in self._lru:
            return None
        self.hit(digest)
        return self.path_for(digest)

    async def get(self, digest: str, on_fetched: Callable[[int], None] | None = None) -> Path:
        """The chunk's file, fetched on a miss. The caller holds `digest` (so it is not
        evicted between this answer and its read). `on_fetched(bytes)`: told when the fetch
        this call started ends (an export counts what it made the node download). Raises
        what the store raises (`BlobNotFound`, a store error after retries), `CorruptBlob`.

        The fetch is a task of its own, which every reader of the chunk awaits shielded:
        a reader that goes away (its QEMU disconnected, its request cancelled) does not
        cancel the fetch another VM's read is waiting on."""
        hit = self.cached(digest)
        if hit is not None:
            return hit
        flight = self._flights.get(digest)
        if flight is not None:  # another read fetches it: wait for that one
            self.counters.hits += 1
        else:
            flight = self._start(digest, on_fetched)
        self._demand.add(digest)  # a read waits for it now, whoever started it
        return await asyncio.shield(flight)

    def prefetch(self, digest: str, on_fetched: Callable[[int], None] | None = None) -> None:
        """Start fetching `digest` unless it is here or on its way; nobody waits for it
        (readahead). Its failure is only counted: a read that needs the chunk fetches it."""
        if digest not in self._lru and digest not in self._flights:
            self.counters.prefetches += 1
            self._start(digest, on_fetched)

    def fetch_ahead(
        self, digest: str, on_fetched: Callable[[int], None] | None = None
    ) -> asyncio.Task[Path] | None:
        """Start fetching `digest` for a trace's prefetch; None when it is here or on its
        way. Not a miss: no read waited for it (a read that joins it counts a hit)."""
        if digest in self._lru or digest in self._flights:
            return None
        return self._start(digest, on_fetched, miss=False)

    def demand_flights(self) -> list[asyncio.Task[Path]]:
        """The fetches reads are waiting for now."""
        return [self._flights[d] for d in self._demand if d in self._flights]

    def room_for(self, nbytes: int, protect_s: float) -> bool:
        """Whether `nbytes` more fit under the cap by evicting only chunks unused for
        `protect_s` seconds (pinned chunks are skipped, as `_evict` skips them)."""
        over = self._bytes + nbytes - self.cap_bytes
        now = time.monotonic()
        for digest, size in self._lru.items():  # oldest first
            if over <= 0:
                break
            if self._pins.get(digest, 0) > 0:
                continue
            if now - self._used.get(digest, -math.inf) < protect_s:
                return False
            over -= size
        return over <= 0

    def _start(
        self, digest: str, on_fetched: Callable[[int], None] | None, *, miss: bool = True
    ) -> asyncio.Task[Path]:
        if miss:
            self.counters.misses += 1
        flight = asyncio.create_task(self._flight(digest, on_fetched))
        # its error is each waiter's; with none left, it is still retrieved (no warning)
        flight.add_done_callback(lambda t: t.cancelled() or t.exception())
        self._flights[digest] = flight
        return flight

    async def _flight(self, digest: str, on_fetched: Callable[[int], None] | None) -> Path:
        try:
            path, size = await self._fetch(digest)
        except BaseException:
            self.counters.fetch_errors += 1
            raise
        finally:
            del self._flights[digest]
            self._demand.discard(digest)
        if on_fetched is not None:
            on_fetched(size)
        return path

    async def _fetch(self, digest: str) -> tuple[Path, int]:
        t0 = time.monotonic()
        part = self._tmp / f"{digest}.{next(self._names)}"
        try:
            size = await retrying(lambda: self.store.get_blob_to(digest, part), self.retry)
            got, _ = await asyncio.to_thread(file_digest, part)
            if got != digest:
                raise CorruptBlob(f"chunk {digest} arrived as {got}")
            dest = self.path_for(digest)
            dest.parent.mkdir(exist_ok=True)
            os.replace(part, dest)
        finally:
            part.unlink(missing_ok=True)
        seconds = time.monotonic() - t0
        self.counters.bytes_fetched += size
        self.counters.fetch_seconds_total += seconds
        self._lru[digest] = size
        self._used[digest] = time.monotonic()
        self._bytes += size
        log.debug("chunk %s fetched: %d bytes in %.3f s", digest, size, seconds)
        self._evict()
        return dest, size

    def _evict(self) -> None:
        if self._bytes <= self.cap_bytes:
            return
        for digest in list(self._lru):
            if self._bytes <= self.cap_bytes:
                break
            if self._pins.get(digest, 0) > 0:
                continue
            size = self._lru.pop(digest)
            self._used.pop(digest, None)
            self._bytes -= size
            self.counters.evictions += 1
            self._close_fd(digest)  # not held, so no read is using it
            self.path_for(digest).unlink(missing_ok=True)
