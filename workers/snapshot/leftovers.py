"""Which repository manifests no longer describe anything (images-at-scale S11): pure
decisions, apart from the log and the store they are read from (`janitor.py`).

A manifest is what keeps its blobs alive (`gc.py`), so a manifest that outlives what it
describes leaks every blob it names. Three kinds outlive their owner:

- a killed sandbox's pause captures, and the volume images uploaded with each
  (`<capture>-v<slot>`): nothing resumes them any more;
- a deleted template's capture (`capture_key`), and a template's own pre-tags capture
  once it is dropped (`TemplateCaptureDropped` naming the template itself);
- an image (`image-<digest>`) that no capture names as its base or runtime disk, once it
  is older than a grace period (a template whose capture is not uploaded yet names its
  image only on its node; the grace covers that window);
- an image's read trace (`image-<digest>.trace`, the block service's): it goes with its
  image, and one written just after its image went (a recording that ended late) is swept
  by the next round (`orphan_traces`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from domain import tags as tg
from domain import template as tp
from workers.snapshot import paths
from workers.snapshot.manifest import SnapshotManifest

__all__ = [
    "StoredImage",
    "capture_keys",
    "dropped_capture_key",
    "images_to_forget",
    "named_images",
    "orphan_traces",
    "pause_keys",
]

#: `<capture>-v<slot>`: a paused sandbox's volume image, uploaded beside its capture.
VOLUME_INFIX = "-v"


def pause_keys(capture_ids: Iterable[str], stored: Iterable[str]) -> list[str]:
    """The stored manifests a killed sandbox's pauses left: each capture in `capture_ids`
    and the volume images (`<capture>-v<slot>`) uploaded with it. Sorted. (For a history
    without its `SandboxRequested`, whose mounts say how many slots: `capture_keys`.)"""
    captures = set(capture_ids)
    out: list[str] = []
    for key in stored:
        if key in captures:
            out.append(key)
            continue
        owner, sep, slot = key.rpartition(VOLUME_INFIX)
        if sep and slot.isdigit() and owner in captures:
            out.append(key)
    return sorted(out)


def capture_keys(capture_ids: Iterable[str], slots: int) -> list[str]:
    """The manifests a killed sandbox's pauses may have left, known without listing the
    store: each capture and one volume image per slot of the sandbox's `slots` volume
    mounts (`<capture>-v<slot>`). Sorted."""
    captures = set(capture_ids)
    volumes = {f"{c}{VOLUME_INFIX}{slot}" for c in captures for slot in range(slots)}
    return sorted(captures | volumes)


def dropped_capture_key(
    event: tp.TemplateDeleted | tp.TemplateCaptureDropped,
    last_key: str | None,
    now: tp.Template | None,
) -> str | None:
    """The capture manifest `event` leaves describing nothing, or None.

    `last_key` is the key of the template's last `TemplateUploaded` before the event (not
    the state's `capture_key`: a registration again under the name clears that, while the
    manifest stays in the store); `now` is the template as the log has it today: a name
    registered again that uploaded the very same key keeps it. A dropped capture of a
    build is a template of its own, deleted (and handled) apart. A paused capture's
    template (`tp.paused_capture_template`) leaves nothing: the manifest is its sandbox's.
    """
    if last_key is None or tp.is_paused_capture_template(event.template_id):
        return None  # a paused sandbox's capture lent to its forks: its sandbox's kill tidies it
    if isinstance(event, tp.TemplateCaptureDropped) and event.capture_id != event.template_id:
        return None
    if now is not None and not now.deleted and now.capture_key == last_key:
        named = isinstance(event, tp.TemplateDeleted) or (
            event.template_id in tg.captures(now.effective_tags())
        )
        if named:
            return None
    return last_key


def named_images(manifests: Iterable[SnapshotManifest]) -> set[str]:
    """Content digests of the disks captures were taken over (base image and runtime disk):
    the images a restore on another node must still be able to fetch."""
    out: set[str] = set()
    for m in manifests:
        if m.base_image.content is not None:
            out.add(m.base_image.content)
        runtime = m.node_manifest.get("runtime_content")
        if isinstance(runtime, str):
            out.add(runtime)
    return out


@dataclass(frozen=True)
class StoredImage:
    """An image manifest in the repository, as the janitor weighs it."""

    digest: str
    recipe: str
    created_at: datetime


def images_to_forget(
    images: Sequence[StoredImage], named: set[str], *, now: datetime, grace: timedelta
) -> list[StoredImage]:
    """The images no capture names that are older than `grace`, oldest first."""
    horizon = now - grace
    gone = [i for i in images if i.digest not in named and i.created_at <= horizon]
    return sorted(gone, key=lambda i: (i.created_at, i.digest))


def orphan_traces(stored: Iterable[str]) -> list[str]:
    """The read traces among the manifest ids `stored` whose image is not among them. A
    trace names no blob and only helps a node prefetch its image: deleting one whose image
    is published again meanwhile loses a prefetch, nothing else. Sorted."""
    ids = set(stored)
    return sorted(
        mid
        for mid in ids
        if (d := paths.trace_digest_from_id(mid)) is not None and paths.image_key(d) not in ids
    )
