"""The `SnapshotStore` port: a flat space of content-addressed blobs plus named manifests.

Deliberately dumb. It knows nothing of memory chunks, qcow2 or manifest schemas — that is
the repository's job — so a new backend is a few dozen lines and the one contract suite
(`tests/contract/snapshot`) proves it. Blobs are immutable and named by their sha256: a
put of an existing digest is harmless, so every operation is safe to repeat after a crash.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Protocol, runtime_checkable

BlobSource = Path | bytes
"""A blob to store: a file (streamed, never read whole) or bytes already in memory."""


@dataclass(frozen=True)
class BlobInfo:
    """One stored blob, as listed; `modified` lets GC spare blobs of uploads in flight."""

    digest: str
    size: int
    modified: datetime


@runtime_checkable
class SnapshotStore(Protocol):
    """Where snapshots live durably. Implementations: `S3Store`, `PosixStore`."""

    async def has_blob(self, digest: str) -> bool:
        """Whether a complete blob with this digest is stored (an empty object under a
        digest of some bytes is the remains of a cut upload: not stored)."""
        ...

    async def put_blob(self, digest: str, source: BlobSource) -> None:
        """Store `source` under `digest`; visible only once complete. The caller vouches
        that `digest` is the sha256 of `source`."""
        ...

    async def get_blob_to(self, digest: str, dest: Path) -> int:
        """Write the blob to `dest` (atomically, verified against `digest`); returns its size.
        Raises `BlobNotFound`, `CorruptBlob`."""
        ...

    async def delete_blob(self, digest: str) -> None:
        """Remove a blob; absent is not an error."""
        ...

    def iter_blobs(self) -> AsyncIterator[BlobInfo]:
        """Every stored blob, in no particular order."""
        ...

    async def put_manifest(self, snapshot_id: str, data: bytes) -> None:
        """Store (or replace) a snapshot's manifest document atomically."""
        ...

    async def get_manifest(self, snapshot_id: str) -> bytes:
        """Raises `ManifestNotFound`."""
        ...

    async def list_manifests(self) -> list[str]:
        """Snapshot ids with a manifest, sorted."""
        ...

    async def delete_manifest(self, snapshot_id: str) -> None:
        """Remove a manifest; absent is not an error."""
        ...

    async def close(self) -> None:
        """Release connections; the store is unusable afterwards."""
        ...
