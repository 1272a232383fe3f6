"""An image's boot working set, pure: which chunks its first reader touched, in what order
(`TraceRecorder`), and what a node that opens the image later fetches ahead from that
(`prefetch_plan`).

Why: a template restored on a node that never held its image reads the same few chunks
first on every node (the guest's page cache was captured warm, but what it drops and the
files `/init` opens come from the disk). Recorded once per fleet, by the first node that
serves the image, and fetched ahead by every later one, those reads find their chunks
on their way instead of each waiting one repository round trip.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from workers.snapshot.manifest import MemoryRef

__all__ = ["PlannedChunk", "TraceRecorder", "TraceSettings", "prefetch_plan"]


@dataclass(frozen=True)
class TraceSettings:
    """How the block service records and replays traces (its command line)."""

    #: seconds after an export's first open during which its reads are recorded (0: never)
    window_s: float = 30.0
    #: chunks a trace holds at most (256 chunks of 4 MiB: 1 GiB, far more than a boot reads)
    limit: int = 256
    #: prefetch fetches in flight at once, demand fetches included (0: no prefetch)
    concurrency: int = 4
    #: a prefetch stops rather than evict a chunk used this recently (a reader's, or an
    #: earlier prefetch's: a cache too small for the trace would churn through itself)
    protect_s: float = 10.0


class TraceRecorder:
    """Chunk indices in first-touch order, from `started` for `window_s` seconds, at most
    `limit` of them. Times are the caller's (monotonic seconds), so this is pure."""

    def __init__(self, started: float, window_s: float, limit: int):
        self.started = started
        self.window_s = window_s
        self.limit = limit
        self._order: dict[int, None] = {}  # insertion-ordered set
        #: called once, when the `limit`th chunk is recorded (its owner stores it sooner)
        self.on_full: Callable[[], None] | None = None

    def done(self, now: float) -> bool:
        return now - self.started >= self.window_s or len(self._order) >= self.limit

    def touch(self, indices: Iterable[int], now: float) -> None:
        """A read touched chunks `indices` (those with data, in the read's order)."""
        if self.done(now):
            return
        for i in indices:
            if i in self._order:
                continue
            self._order[i] = None
            if len(self._order) >= self.limit:
                if self.on_full is not None:
                    self.on_full()
                return

    @property
    def chunks(self) -> tuple[int, ...]:
        return tuple(self._order)


@dataclass(frozen=True)
class PlannedChunk:
    """One chunk to fetch ahead: its index in the disk, its digest, its length."""

    index: int
    digest: str
    size: int


def prefetch_plan(trace: Iterable[int], disk: MemoryRef) -> list[PlannedChunk]:
    """The trace's chunks to fetch, in its order: indices past the disk's end dropped (a
    trace is trusted no more than needed), zero chunks dropped (they are never fetched),
    and a digest that recurs fetched at its first place only."""
    out: list[PlannedChunk] = []
    seen: set[str] = set()
    for i in trace:
        if not 0 <= i < len(disk.chunks):
            continue
        digest = disk.chunks[i]
        if digest is None or digest in seen:
            continue
        seen.add(digest)
        out.append(PlannedChunk(i, digest, disk.chunk_len(i)))
    return out
