"""The node's ports: the narrow interfaces it is handed by its composition root instead of
importing another service (rule 4: workers never import each other).

`CaptureRepository` is what the node needs of the snapshot repository
(`workers.snapshot.SnapshotRepository` satisfies it): uploading a capture and pulling one
back. The contract suite runs the real repository against S3 and a filesystem.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

__all__ = ["CaptureRepository", "Fetched", "Manifest", "Uploaded"]


class _BaseImage(Protocol):
    @property
    def digest(self) -> str: ...


class Manifest(Protocol):
    """A stored capture's manifest: the node needs the base image it stacks on."""

    @property
    def base_image(self) -> _BaseImage: ...


class Fetched(Protocol):
    """A capture rebuilt on this node's disk."""

    @property
    def dir(self) -> Path: ...

    @property
    def blobs_fetched(self) -> int: ...

    @property
    def bytes_fetched(self) -> int: ...


class Uploaded(Protocol):
    @property
    def blobs_uploaded(self) -> int: ...

    @property
    def bytes_uploaded(self) -> int: ...


class CaptureRepository(Protocol):
    """Where captures become durable (S3, a shared filesystem), by snapshot id."""

    async def upload(
        self, snapshot_dir: Path, *, base_image_digest: str, snapshot_id: str
    ) -> Uploaded: ...

    async def get_manifest(self, snapshot_id: str) -> Manifest: ...

    async def download(
        self, snapshot_id: str, dest_dir: Path, base_image_path: Path,
        *, layers_dir: Path | None = None,
    ) -> Fetched: ...  # fmt: skip
