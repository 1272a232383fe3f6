"""Garbage collection of a store's blobs: those no manifest names, once old enough.

Uploads write blobs first and their manifest last, so a blob no manifest names may belong
to an upload still in flight: `min_age` spares those, and manifests written while the blobs
were listed are read before anything is deleted.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from workers.snapshot.errors import LayoutError, ManifestNotFound
from workers.snapshot.manifest import parse_manifest
from workers.snapshot.results import GcReport
from workers.snapshot.retry import RetryPolicy, retrying
from workers.snapshot.store import SnapshotStore

__all__ = ["collect_garbage"]


async def collect_garbage(
    store: SnapshotStore, retry: RetryPolicy, *, min_age: timedelta = timedelta(hours=1)
) -> GcReport:
    """Delete blobs that no manifest names and that are older than `min_age`.

    `min_age` protects uploads in flight (blobs first, manifest last). An unreadable
    manifest aborts the collection rather than freeing the blobs it might name.
    """
    ids = await retrying(store.list_manifests, retry)
    live = await _referenced(store, retry, ids)
    cutoff = datetime.now(UTC) - min_age
    candidates: dict[str, int] = {}
    kept = young = 0
    async for blob in store.iter_blobs():
        if blob.digest in live:
            kept += 1
        elif blob.modified > cutoff:
            young += 1
        else:
            candidates[blob.digest] = blob.size
    # Manifests written while we listed blobs may name some candidates: look again.
    newer = sorted(set(await retrying(store.list_manifests, retry)) - set(ids))
    for digest in await _referenced(store, retry, newer):
        if candidates.pop(digest, None) is not None:
            kept += 1
    for digest in candidates:
        await retrying(functools.partial(store.delete_blob, digest), retry)
    return GcReport(tuple(sorted(candidates)), sum(candidates.values()), kept, young)


async def _referenced(store: SnapshotStore, retry: RetryPolicy, ids: Sequence[str]) -> set[str]:
    live: set[str] = set()
    for sid in ids:
        try:
            data = await retrying(functools.partial(store.get_manifest, sid), retry)
        except ManifestNotFound:  # deleted while we listed: its blobs are fair game
            continue
        try:
            live |= parse_manifest(data).blob_digests()
        except ValueError as e:
            raise LayoutError(f"snapshot {sid}: unreadable manifest: {e}") from e
    return live
