"""What the repository's operations hand back: plain values, nothing to close."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from workers.snapshot.manifest import ImageManifest, SnapshotManifest, VolumeManifest


@dataclass(frozen=True)
class UploadResult:
    """A durable snapshot, and what this upload had to send (the rest was already stored)."""

    manifest: SnapshotManifest | VolumeManifest
    blobs_uploaded: int
    bytes_uploaded: int
    blobs_reused: int


@dataclass(frozen=True)
class LocalSnapshot:
    """A downloaded snapshot laid out like the node's own snapshot directories.

    `dir/manifest.json` is the node's manifest with `disk_top` and `base_image` rewritten to
    local paths, so the node reads it back as if it had captured the snapshot itself.
    """

    dir: Path
    state: Path
    mem: Path
    layers: tuple[Path, ...]  # bottom (on the base) to top, backing paths rewritten
    base_image: Path
    manifest: SnapshotManifest
    blobs_fetched: int  # cache misses: blobs pulled from the store
    bytes_fetched: int

    @property
    def disk_top(self) -> Path:
        return self.layers[-1]


@dataclass(frozen=True)
class ImageUpload:
    """A stored image, and what this upload had to send (`UploadResult`'s fields)."""

    manifest: ImageManifest
    blobs_uploaded: int
    bytes_uploaded: int
    blobs_reused: int


@dataclass(frozen=True)
class LocalImage:
    """A disk image downloaded whole and verified: `disk` (sparse) holds exactly the bytes
    whose content digest is `manifest.digest`; `kernel`/`initrd` are None for a runtime disk."""

    dir: Path
    disk: Path
    kernel: Path | None
    initrd: Path | None
    manifest: ImageManifest
    bytes_fetched: int


@dataclass(frozen=True)
class GcReport:
    """One garbage collection: what went, what stayed, what was too young to judge."""

    deleted: tuple[str, ...]
    bytes_freed: int
    kept: int
    spared_young: int
