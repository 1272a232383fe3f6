"""A capture is stacked only on the bytes it was taken over (issue 40).

A capture's qcow2 layers hold the blocks its guest wrote, over the base image and beside
the runtime disk it ran with. Two builds of one recipe are two different ext4 filesystems
(mkfs copies the tree's timestamps and walks it in the host's readdir order), so layers
rebuilt over another node's build of "the same" image give the guest a filesystem whose
metadata points at blocks that hold something else: `EXT4-fs error … checksumming
directory block 0` and a dead sandbox on its first write. The manifest therefore records
the content digests (`shared/diskdigest.py`) of both disks, and a restoring node compares
them with its own before it fetches anything.

A capture taken before digests were recorded says nothing about its bytes: it is rebuilt
only on the node that took it (`foreign=False`), never on another one.
"""

from __future__ import annotations

from workers.snapshot.errors import LayoutError
from workers.snapshot.manifest import SnapshotManifest

__all__ = ["check_disks"]


def check_disks(
    manifest: SnapshotManifest,
    *,
    base: str | None,
    runtime: str | None,
    foreign: bool,
) -> None:
    """Raise `LayoutError` unless this node's disks are the capture's: `base` and `runtime`
    are the content digests of this node's base image and runtime disk (None: not checked,
    the caller vouches for its own disk); `foreign`, the capture was taken on another node."""
    sid = manifest.snapshot_id
    recorded = manifest.base_image.content
    if recorded is None:
        if foreign:
            raise LayoutError(
                f"snapshot {sid} was taken before captures recorded the bytes of their base "
                f"image (recipe {manifest.base_image.digest}), so it is not known to match "
                "this node's copy: refusing to stack its layers on it; it resumes on the "
                "node that took it"
            )
        return
    if base is not None and base != recorded:
        raise LayoutError(_other_bytes(sid, "base image", recorded, base))
    runtime_recorded = manifest.node_manifest.get("runtime_content")
    if runtime is not None and runtime_recorded is not None and runtime != runtime_recorded:
        raise LayoutError(_other_bytes(sid, "envd runtime disk", str(runtime_recorded), runtime))


def _other_bytes(sid: str, disk: str, theirs: str, ours: str) -> str:
    return (
        f"snapshot {sid} was taken over {disk} {theirs}; this node's {disk} is {ours} "
        "(other bytes): refusing to stack its layers on them; it resumes where its "
        "bytes are (the node that took it)"
    )
