"""Snapshot repository: content-addressed snapshots in S3 or a shared filesystem.

The node calls `SnapshotRepository.upload` after a pause and `download` to resume a
sandbox elsewhere; `ImageRepository` stores guest disk images as content beside them.
Everything else here is the machinery behind those calls.
"""

from workers.snapshot.cache import BlobCache
from workers.snapshot.chunks import CHUNK_SIZE
from workers.snapshot.diskchain import walk_chain
from workers.snapshot.errors import (
    BlobNotFound,
    CorruptBlob,
    LayoutError,
    ManifestNotFound,
    RetryableStoreError,
    SnapshotError,
    StoreError,
)
from workers.snapshot.images import ImageFiles, ImageRepository
from workers.snapshot.manifest import (
    BaseImageRef,
    BlobRef,
    ImageManifest,
    LayerRef,
    MemoryRef,
    SnapshotManifest,
    VolumeManifest,
)
from workers.snapshot.posix import PosixStore
from workers.snapshot.repository import SnapshotRepository
from workers.snapshot.results import GcReport, ImageUpload, LocalImage, LocalSnapshot, UploadResult
from workers.snapshot.retry import RetryPolicy
from workers.snapshot.s3 import S3Config, S3Store
from workers.snapshot.store import BlobInfo, BlobSource, SnapshotStore

__all__ = [
    "CHUNK_SIZE",
    "BaseImageRef",
    "BlobCache",
    "BlobInfo",
    "BlobNotFound",
    "BlobRef",
    "BlobSource",
    "CorruptBlob",
    "GcReport",
    "ImageFiles",
    "ImageManifest",
    "ImageRepository",
    "ImageUpload",
    "LayerRef",
    "LayoutError",
    "LocalImage",
    "LocalSnapshot",
    "ManifestNotFound",
    "MemoryRef",
    "PosixStore",
    "RetryPolicy",
    "RetryableStoreError",
    "S3Config",
    "S3Store",
    "SnapshotError",
    "SnapshotManifest",
    "SnapshotRepository",
    "SnapshotStore",
    "StoreError",
    "UploadResult",
    "VolumeManifest",
    "walk_chain",
]
