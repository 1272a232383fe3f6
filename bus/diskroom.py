"""Placement by disk (images-at-scale S9): what a create of a template needs of a node's
disk, and which nodes have it — the one rule the API (before it queues a create) and the
node (before it takes one) both apply, each to the numbers it has.

A node holding the template's capture needs only the headroom: the new sandbox's writes
(its disk's top layer grows). A node without it fetches the capture and the image and
runtime disks under it first, whose sizes the template's upload recorded (`template_bytes`;
0 when the log has none). A node that does not say its room (`disk_room` None: no budget
set, or from before disk accounting) counts as having it: it decides itself when it pulls.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from bus.nodes import Heartbeat

__all__ = ["DiskNeed", "disk_need", "fits_disk", "short_of_disk", "template_bytes"]


def template_bytes(capture_bytes: int | None, image_bytes: int | None) -> int:
    """What a node without the template stores to create from it (unknown sizes: 0)."""
    return (capture_bytes or 0) + (image_bytes or 0)


def disk_need(fetched: int, headroom: int, *, held: bool) -> int:
    """Bytes a node must have room for to take a create: the headroom, plus what it fetches
    (`fetched`: `template_bytes`) unless it holds the template already."""
    return headroom + (0 if held else fetched)


def fits_disk(room: int | None, need: int) -> bool:
    """Whether a node with `room` bytes (None: it does not say) can take a create that
    needs `need`."""
    return room is None or room >= need


@dataclass(frozen=True)
class DiskNeed:
    """A create's demand on a node's disk, as the API works it out from the template's row
    and its own headroom setting."""

    template_id: str
    fetched: int
    headroom: int

    def on(self, beat: Heartbeat) -> int:
        """The bytes `beat`'s node needs free for it (held there: the headroom only)."""
        return disk_need(self.fetched, self.headroom, held=self.template_id in beat.templates)

    def fits(self, beat: Heartbeat) -> bool:
        return fits_disk(beat.disk_room, self.on(beat))

    def refusal(self, live: Iterable[Heartbeat]) -> str:
        """What a 503 says when no live node has the room: the disk, the need, the most
        room any node has."""
        beats = list(live)
        known = [b for b in beats if b.disk_room is not None]
        most = max(known, key=lambda b: b.disk_room or 0, default=None)
        need = min((self.on(b) for b in beats), default=self.headroom + self.fetched)
        largest = (
            f"largest room {most.disk_room} bytes on {most.node_id}" if most else "no room known"
        )
        return (
            f"no node has disk room for template {self.template_id}: needs {need} bytes "
            f"(with {self.headroom} headroom), {largest}"
        )


def short_of_disk(beats: Iterable[Heartbeat], need: DiskNeed) -> bool:
    """True when none of `beats` has the disk room `need` asks (none at all: False)."""
    listed = list(beats)
    return bool(listed) and not any(need.fits(b) for b in listed)
