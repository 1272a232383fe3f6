"""What envd keeps of a process's output and exit for clients that were not attached.

A `commands.run` stream may be cut (a proxy's or load balancer's idle timeout, the client
or the API restarting) while its process goes on in the guest. Each process keeps the
last `TAIL_BYTES` of each output stream (`OutputTail`): a client that connects again gets
what was read while no stream was attached, and once the process has ended its exit and
that tail stay in `EndedTable` — the `ENDED_KEEP` most recent, each for `ENDED_KEEP_S`
seconds — so `commands.connect(pid)` still answers with the output's tail and the exit
code (E2B's envd forgets a process at its exit). Both are bounded: ~`TAIL_BYTES` per stream
of a process, `ENDED_KEEP` records.
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

#: bytes of each output stream (stdout, stderr, or the pty) a process keeps
TAIL_BYTES = 64 * 1024
#: ended processes kept for `commands.connect(pid)` (the most recent ones)
ENDED_KEEP = 64
#: seconds an ended process stays there after its exit
ENDED_KEEP_S = 600.0


class OutputTail:
    """The last `limit` bytes of each of a process's output streams, each chunk numbered
    in the order it was read, so the streams can be replayed interleaved as they came."""

    def __init__(self, limit: int = TAIL_BYTES) -> None:
        self.limit = limit
        #: chunks read so far (the next chunk's number)
        self.count = 0
        self._chunks: dict[bytes, deque[tuple[int, bytes]]] = {}
        self._sizes: dict[bytes, int] = {}

    def add(self, stream: bytes, data: bytes) -> int:
        """Keep `data`, read from `stream` (any key naming it); returns its number."""
        seq = self.count
        self.count += 1
        if self.limit <= 0 or not data:
            return seq
        chunks = self._chunks.setdefault(stream, deque())
        if len(data) > self.limit:
            data = data[-self.limit :]
        chunks.append((seq, data))
        size = self._sizes.get(stream, 0) + len(data)
        while size > self.limit:  # drop from the front: whole chunks, then part of one
            first_seq, first = chunks[0]
            excess = size - self.limit
            if len(first) <= excess:
                chunks.popleft()
                size -= len(first)
            else:
                chunks[0] = (first_seq, first[excess:])
                size = self.limit
        self._sizes[stream] = size
        return seq

    def size(self, stream: bytes) -> int:
        return self._sizes.get(stream, 0)

    def since(self, seq: int = 0) -> list[tuple[int, bytes, bytes]]:
        """What is kept of chunks `seq` and later, in the order read, as (number of its
        first chunk, stream, bytes) runs: consecutive chunks of one stream are joined."""
        kept = [
            [(s, stream, d) for s, d in chunks if s >= seq]
            for stream, chunks in self._chunks.items()
        ]
        runs: list[tuple[int, bytes, list[bytes]]] = []
        for s, stream, data in heapq.merge(*kept):
            if runs and runs[-1][1] == stream:
                runs[-1][2].append(data)
            else:
                runs.append((s, stream, [data]))
        return [(s, stream, b"".join(parts)) for s, stream, parts in runs]


@dataclass
class Ended:
    """A process that has ended: what `commands.connect(pid)` replays, then its end."""

    pid: int
    tag: str | None
    config_json: dict[str, Any]
    tail: OutputTail
    #: the encoded end event (its exit code and status)
    end: bytes
    #: when it ended (the table's clock)
    at: float


class EndedTable:
    """The `keep` most recent ended processes, each for `keep_s` seconds after its end."""

    def __init__(
        self,
        keep: int = ENDED_KEEP,
        keep_s: float = ENDED_KEEP_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.keep = keep
        self.keep_s = keep_s
        self.clock = clock
        self._ended: OrderedDict[int, Ended] = OrderedDict()  # oldest end first

    def __len__(self) -> int:
        self._expire()
        return len(self._ended)

    def __iter__(self) -> Iterator[Ended]:
        self._expire()
        return iter(list(self._ended.values()))

    def now(self) -> float:
        return self.clock()

    def set_bounds(self, keep: int | None = None, keep_s: float | None = None) -> None:
        """New bounds (None: unchanged), applied to what is kept too."""
        if keep is not None:
            self.keep = keep
        if keep_s is not None:
            self.keep_s = keep_s
        self._expire()

    def add(self, rec: Ended) -> None:
        self._ended.pop(rec.pid, None)
        if self.keep > 0 and self.keep_s > 0:
            self._ended[rec.pid] = rec
        self._expire()

    def forget(self, pid: int) -> None:
        """A new process got this pid: the old record no longer answers for it."""
        self._ended.pop(pid, None)

    def find(self, pid: int | None = None, tag: str | None = None) -> Ended | None:
        """The ended process with this pid, else the latest one with this tag."""
        self._expire()
        if pid is not None:
            return self._ended.get(pid)
        if tag is not None:
            for rec in reversed(self._ended.values()):
                if rec.tag == tag:
                    return rec
        return None

    def _expire(self) -> None:
        horizon = self.clock() - self.keep_s
        while self._ended:
            oldest = next(iter(self._ended.values()))
            if len(self._ended) <= self.keep and oldest.at > horizon:
                break
            self._ended.popitem(last=False)
