"""The one owner of object keys in a snapshot store (conventions rule 1).

Layout, under an optional prefix:

    blobs/sha256/<first two hex>/<digest>   content-addressed bytes (layers, chunks, state)
    manifests/<snapshot_id>.json            one document per snapshot
    manifests/image-<content digest>.json   one document per disk image (`image_key`)
    manifests/image-<content digest>.trace.json   the chunks its first reads touched (`trace_key`)

The two-character fan-out keeps posix directories small and spreads S3 key ranges.
Both stores and every test derive keys from here; nothing else writes a key literal.
"""

from __future__ import annotations

import re

BLOBS = "blobs/sha256/"
MANIFESTS = "manifests/"
MANIFEST_SUFFIX = ".json"

_DIGEST = re.compile(r"^[0-9a-f]{64}$")
# Ids become file names and key segments: no slashes, no dot-only names, bounded length.
_SNAPSHOT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def is_digest(value: str) -> bool:
    """A lowercase hex sha256."""
    return bool(_DIGEST.match(value))


def check_digest(value: str) -> str:
    if not is_digest(value):
        raise ValueError(f"not a sha256 hex digest: {value!r}")
    return value


def check_snapshot_id(value: str) -> str:
    if not _SNAPSHOT_ID.match(value):
        raise ValueError(f"invalid snapshot id {value!r}: use [A-Za-z0-9._-], at most 128 chars")
    return value


#: Image manifests share the manifests' namespace under this prefix: an image's key is
#: its content digest (`shared/diskdigest.py`), so any node finds the same bytes under it.
IMAGE_PREFIX = "image-"


def image_key(digest: str) -> str:
    """The manifest id of the disk image whose content digest is `digest`."""
    return check_snapshot_id(f"{IMAGE_PREFIX}{check_digest(digest)}")


def image_digest_from_id(manifest_id: str) -> str | None:
    """The content digest an image manifest id names, or None for any other manifest."""
    if not manifest_id.startswith(IMAGE_PREFIX):
        return None
    digest = manifest_id[len(IMAGE_PREFIX) :]
    return digest if is_digest(digest) else None


#: An image's read trace (the block service's prefetch list) sits beside its manifest:
#: `image-<digest>.trace`. It names no blob, and goes when the image's manifest goes.
TRACE_SUFFIX = ".trace"


def trace_key(digest: str) -> str:
    """The manifest id of the read trace of the image whose content digest is `digest`."""
    return check_snapshot_id(f"{image_key(digest)}{TRACE_SUFFIX}")


def trace_digest_from_id(manifest_id: str) -> str | None:
    """The content digest whose trace `manifest_id` is, or None for any other manifest."""
    if not manifest_id.endswith(TRACE_SUFFIX):
        return None
    return image_digest_from_id(manifest_id[: -len(TRACE_SUFFIX)])


def normalize_prefix(prefix: str) -> str:
    """'' or 'a/b/' — a prefix always ends in one slash so keys join without doubling."""
    prefix = prefix.strip("/")
    return f"{prefix}/" if prefix else ""


def blob_key(digest: str, prefix: str = "") -> str:
    check_digest(digest)
    return f"{normalize_prefix(prefix)}{BLOBS}{digest[:2]}/{digest}"


def blobs_root(prefix: str = "") -> str:
    return f"{normalize_prefix(prefix)}{BLOBS}"


def manifest_key(snapshot_id: str, prefix: str = "") -> str:
    check_snapshot_id(snapshot_id)
    return f"{normalize_prefix(prefix)}{MANIFESTS}{snapshot_id}{MANIFEST_SUFFIX}"


def manifests_root(prefix: str = "") -> str:
    return f"{normalize_prefix(prefix)}{MANIFESTS}"


def digest_from_key(key: str, prefix: str = "") -> str | None:
    """The digest a blob key names, or None for anything else (stray objects are ignored)."""
    root = blobs_root(prefix)
    if not key.startswith(root):
        return None
    rest = key[len(root) :]
    fan, _, digest = rest.partition("/")
    if not is_digest(digest) or fan != digest[:2]:
        return None
    return digest


def snapshot_id_from_key(key: str, prefix: str = "") -> str | None:
    root = manifests_root(prefix)
    if not key.startswith(root) or not key.endswith(MANIFEST_SUFFIX):
        return None
    sid = key[len(root) : -len(MANIFEST_SUFFIX)]
    return sid if _SNAPSHOT_ID.match(sid) else None


#: The sha256 of no bytes: the one digest whose blob may be empty.
EMPTY_DIGEST = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def complete_size(digest: str, size: int) -> bool:
    """Whether a stored object of `size` bytes can be the whole blob `digest`. A PUT cut
    short (its upload cancelled by the sandbox's resume) left an empty object under the
    blob's key on SeaweedFS; judged present, it was never sent again, and a capture that
    named it could not be restored on another node (the fleet test under CPU load)."""
    return size > 0 or digest == EMPTY_DIGEST
