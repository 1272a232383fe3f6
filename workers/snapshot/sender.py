"""`BlobSender`: the blobs of one upload, each stored once and only if the store lacks it."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable

from workers.snapshot.retry import RetryPolicy, retrying
from workers.snapshot.store import BlobSource, SnapshotStore

__all__ = ["BlobSender", "const"]


class BlobSender:
    """Puts blobs that are missing, once each, and remembers which it found already there."""

    def __init__(self, store: SnapshotStore, retry: RetryPolicy):
        self.store = store
        self.retry = retry
        self.sources: dict[str, Callable[[], Awaitable[BlobSource]]] = {}
        self.reused: set[str] = set()
        self.uploaded = 0
        self.bytes = 0

    async def ensure(
        self,
        digest: str,
        source: Callable[[], Awaitable[BlobSource]],
        data: BlobSource | None = None,
    ) -> None:
        """Store `digest` unless present; `source` (re)produces its bytes, `data` if already
        at hand saves a read."""
        if digest in self.sources:  # the same bytes twice in one snapshot
            return
        self.sources[digest] = source
        if await self._has(digest):
            self.reused.add(digest)
            return
        await self._put(digest, data)

    async def _has(self, digest: str) -> bool:
        return await retrying(lambda: self.store.has_blob(digest), self.retry)

    async def _put(self, digest: str, data: BlobSource | None) -> None:
        body = data if data is not None else await self.sources[digest]()
        await retrying(lambda: self.store.put_blob(digest, body), self.retry)
        self.uploaded += 1
        self.bytes += len(body) if isinstance(body, bytes) else os.stat(body).st_size

    async def recheck_reused(self) -> None:
        """Re-send reused blobs a concurrent GC removed before our manifest protected them."""
        for digest in sorted(self.reused):
            if not await self._has(digest):
                await self._put(digest, None)


def const(source: BlobSource) -> Callable[[], Awaitable[BlobSource]]:
    """A blob source that is already at hand (a file's path), for `BlobSender.ensure`."""

    async def get() -> BlobSource:
        return source

    return get
