"""Snapshot repository: content-addressed snapshots in S3 or a shared filesystem.

The node calls `SnapshotRepository.upload` after a pause and `download` to resume a
sandbox elsewhere; everything else here is the machinery behind those two calls.
"""

from workers.snapshot.errors import (
    BlobNotFound,
    CorruptBlob,
    LayoutError,
    ManifestNotFound,
    RetryableStoreError,
    SnapshotError,
    StoreError,
)
from workers.snapshot.posix import PosixStore
from workers.snapshot.s3 import S3Config, S3Store
from workers.snapshot.store import BlobInfo, BlobSource, SnapshotStore

__all__ = [
    "BlobInfo",
    "BlobNotFound",
    "BlobSource",
    "CorruptBlob",
    "LayoutError",
    "ManifestNotFound",
    "PosixStore",
    "RetryableStoreError",
    "S3Config",
    "S3Store",
    "SnapshotError",
    "SnapshotStore",
    "StoreError",
]
