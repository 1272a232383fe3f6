"""The stored description of one snapshot: which blobs make it up and how they fit together.

A manifest is written last, after every blob it names is durable, so its presence means
the snapshot is complete; GC treats every blob a manifest names as live. Unknown fields
are kept out (extra="forbid") so a typo never silently drops data; new fields get defaults.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from workers.snapshot.paths import check_digest, check_snapshot_id, image_key, trace_key

FORMAT_VERSION = 1


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BlobRef(_Frozen):
    """A whole file stored as one blob (the device state)."""

    digest: str
    size: int = Field(ge=0)

    _digest = field_validator("digest")(check_digest)


class LayerRef(_Frozen):
    """One frozen qcow2 disk layer. `backing_digest` None means it sits on the base image."""

    digest: str
    size: int = Field(ge=0)
    backing_digest: str | None
    backing_format: Literal["raw", "qcow2"]

    _digest = field_validator("digest")(check_digest)


class MemoryRef(_Frozen):
    """Guest RAM as fixed-size chunks; None marks an all-zero chunk (a hole, never stored)."""

    size: int = Field(ge=0)
    chunk_size: int = Field(gt=0)
    chunks: tuple[str | None, ...]

    @model_validator(mode="after")
    def _shape(self) -> MemoryRef:
        if len(self.chunks) != -(-self.size // self.chunk_size):
            raise ValueError(
                f"{len(self.chunks)} chunks cannot cover {self.size} bytes "
                f"in {self.chunk_size}-byte chunks"
            )
        for c in self.chunks:
            if c is not None:
                check_digest(c)
        return self

    def chunk_len(self, index: int) -> int:
        """Bytes in chunk `index` (the last one may be short)."""
        return min(self.chunk_size, self.size - index * self.chunk_size)

    @property
    def stored_bytes(self) -> int:
        return sum(self.chunk_len(i) for i, c in enumerate(self.chunks) if c is not None)


class BaseImageRef(_Frozen):
    """The template's raw base image: not uploaded (every node has it), only identified.
    `digest` names it in a node's image cache (its recipe); `content` is what its bytes are
    (`shared/diskdigest.py`), the one thing a restoring node's copy must match
    (`samebytes.py`). None: a capture taken before it was recorded (stays on its node)."""

    digest: str
    size: int = Field(ge=0)
    content: str | None = None


class SnapshotManifest(_Frozen):
    """Everything needed to rebuild a snapshot directory on any node with the base image."""

    format: Literal[1] = 1  # FORMAT_VERSION
    snapshot_id: str
    parent_id: str | None = None
    created_at: datetime
    fingerprint: str  # the machine fingerprint; a restore needs an equal machine
    machine: dict[str, Any]
    base_image: BaseImageRef
    layers: tuple[LayerRef, ...]  # bottom (on the base) to top
    memory: MemoryRef
    state: BlobRef
    node_manifest: dict[str, Any]  # the node's own manifest.json, for a faithful rebuild

    _sid = field_validator("snapshot_id")(check_snapshot_id)

    @model_validator(mode="after")
    def _chain(self) -> SnapshotManifest:
        if not self.layers:
            raise ValueError("a snapshot needs at least one disk layer")
        below: str | None = None
        for layer in self.layers:
            if layer.backing_digest != below:
                raise ValueError(f"layer {layer.digest[:12]} is not stacked on the layer below")
            if layer.backing_format != ("raw" if below is None else "qcow2"):
                raise ValueError(f"layer {layer.digest[:12]} has the wrong backing format")
            below = layer.digest
        return self

    def blob_digests(self) -> set[str]:
        """Every blob this snapshot needs (what GC must keep)."""
        out = {self.state.digest, *(layer.digest for layer in self.layers)}
        out.update(c for c in self.memory.chunks if c is not None)
        return out

    @property
    def stored_bytes(self) -> int:
        """Bytes of blobs (before dedup against other snapshots)."""
        return self.state.size + sum(x.size for x in self.layers) + self.memory.stored_bytes

    def to_json(self) -> bytes:
        return self.model_dump_json(indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes) -> SnapshotManifest:
        return cls.model_validate_json(data)


class VolumeManifest(_Frozen):
    """One image of a volume (`docs/volumes.md`): a sparse file of fixed size, stored as
    content-addressed chunks like guest RAM (holes and zero chunks are never stored, so a
    64 GiB volume holding 10 MiB stores about that). `key` is its name among the
    manifests: a released version (`vol-<id>-…`) or the volume as a paused sandbox left it
    (`<capture>-v<slot>`)."""

    format: Literal[1] = 1
    kind: Literal["volume"] = "volume"
    key: str
    volume_id: str
    created_at: datetime
    image: MemoryRef

    _key = field_validator("key")(check_snapshot_id)

    def blob_digests(self) -> set[str]:
        return {c for c in self.image.chunks if c is not None}

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()

    @classmethod
    def from_json(cls, data: bytes) -> VolumeManifest:
        return cls.model_validate_json(data)


class ImageManifest(_Frozen):
    """A guest disk image as content (images-at-scale §2): its raw sparse disk as chunks
    (zero chunks never stored), with the kernel and initramfs it boots with (a runtime
    disk has neither). `digest` is the disk's content digest (`shared/diskdigest.py`, the
    Merkle root over `disk`'s chunk list) and names the manifest (`paths.image_key`), so two
    builds of one `recipe` that gave different bytes are two images, never confused."""

    format: Literal[1] = 1
    kind: Literal["image"] = "image"
    digest: str
    role: Literal["root", "runtime"]
    recipe: str  # the recipe digest this build came from (how the builder found it)
    label: str = ""
    created_at: datetime
    disk: MemoryRef
    kernel: BlobRef | None = None
    initrd: BlobRef | None = None
    #: The builder's own description of the image (the node cache's `manifest.json`: guest
    #: defaults, kernel, `kernel_cmdline_base`...), without its `content` section, which a
    #: fetching node rebuilds from `disk` and its own copy's stamp. Opaque here; kept in
    #: the manifest (a few KiB) rather than as a blob, so it needs no GC of its own.
    meta: dict[str, Any] | None = None

    _digest = field_validator("digest")(check_digest)

    @property
    def key(self) -> str:
        return image_key(self.digest)

    def blob_digests(self) -> set[str]:
        """The disk's chunks, kernel and initrd: what GC must keep while this image is named."""
        out = {c for c in self.disk.chunks if c is not None}
        out.update(ref.digest for ref in (self.kernel, self.initrd) if ref is not None)
        return out

    @property
    def stored_bytes(self) -> int:
        extra = sum(ref.size for ref in (self.kernel, self.initrd) if ref is not None)
        return self.disk.stored_bytes + extra

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()

    @classmethod
    def from_json(cls, data: bytes) -> ImageManifest:
        return cls.model_validate_json(data)


class TraceManifest(_Frozen):
    """The chunks of an image's disk its first reader touched (issue 29's prefetch): chunk
    indices in first-touch order, recorded by a block service in the first `window_s`
    seconds after it opened the image. Indices, not digests: a trace names no blob, so it
    never keeps one alive (GC) and means nothing without its image's manifest, with which
    the janitor deletes it (`trace_key` beside `image_key`)."""

    format: Literal[1] = 1
    kind: Literal["trace"] = "trace"
    digest: str  # the image's content digest
    created_at: datetime
    window_s: float = Field(ge=0)
    chunks: tuple[int, ...]

    _digest = field_validator("digest")(check_digest)

    @field_validator("chunks")
    @classmethod
    def _indices(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if any(i < 0 for i in v) or len(set(v)) != len(v):
            raise ValueError("a trace lists distinct chunk indices")
        return v

    @property
    def key(self) -> str:
        return trace_key(self.digest)

    def blob_digests(self) -> set[str]:
        """None: the image's manifest keeps its chunks alive, not its trace."""
        return set()

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()

    @classmethod
    def from_json(cls, data: bytes) -> TraceManifest:
        return cls.model_validate_json(data)


Manifest = SnapshotManifest | VolumeManifest | ImageManifest | TraceManifest


def parse_manifest(data: bytes) -> Manifest:
    """A stored manifest document of any kind (they share one namespace of ids)."""
    doc = json.loads(data)
    kind = doc.get("kind") if isinstance(doc, dict) else None
    if kind == "trace":
        return TraceManifest.model_validate(doc)
    if kind == "volume":
        return VolumeManifest.model_validate(doc)
    if kind == "image":
        return ImageManifest.model_validate(doc)
    return SnapshotManifest.model_validate(doc)
