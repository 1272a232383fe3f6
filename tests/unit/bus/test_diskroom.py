"""Placement by disk, the pure rule (`bus/diskroom.py`): which nodes have the room a
create of a template needs, and what a refusal says. The VM-less tier runs it end to end
(`tests/vmless/test_disk_placement.py`)."""

from __future__ import annotations

from bus.diskroom import DiskNeed, disk_need, fits_disk, short_of_disk, template_bytes
from bus.nodes import Heartbeat

GIB = 1 << 30


def beat(node: str, room: int | None, *held: str) -> Heartbeat:
    return Heartbeat(node_id=node, at=0.0, disk_room=room, templates=held)


def test_a_node_holding_the_template_needs_only_the_headroom() -> None:
    assert disk_need(5 * GIB, GIB, held=True) == GIB
    assert disk_need(5 * GIB, GIB, held=False) == 6 * GIB
    need = DiskNeed("tpl", 5 * GIB, GIB)
    assert need.on(beat("a", 0, "tpl")) == GIB and need.on(beat("b", 0)) == 6 * GIB
    # the holder fits with headroom only; the other would fetch it all
    assert need.fits(beat("a", GIB, "tpl")) and not need.fits(beat("b", 5 * GIB))
    assert need.fits(beat("b", 6 * GIB))


def test_unknown_room_or_sizes_are_no_reason_to_refuse() -> None:
    """A node that says no room (no budget, an older node) decides itself when it pulls;
    a template uploaded before sizes were recorded counts as nothing to fetch."""
    assert fits_disk(None, 1 << 60)
    assert DiskNeed("tpl", 1 << 60, GIB).fits(beat("old", None))
    assert template_bytes(None, None) == 0 and template_bytes(3, None) == 3
    assert template_bytes(3, 4) == 7


def test_the_fleet_is_short_only_when_every_node_is() -> None:
    need = DiskNeed("tpl", 5 * GIB, GIB)
    assert short_of_disk([beat("a", 2 * GIB), beat("b", 0)], need)
    assert not short_of_disk([beat("a", 2 * GIB), beat("b", 7 * GIB)], need)
    assert not short_of_disk([beat("a", 2 * GIB, "tpl"), beat("b", 0)], need)
    assert not short_of_disk([beat("a", 0), beat("b", None)], need)
    assert not short_of_disk([], need)  # no node at all is another refusal


def test_a_refusal_names_the_disk_the_need_and_the_largest_room() -> None:
    need = DiskNeed("big", 5 * GIB, GIB)
    why = need.refusal([beat("a", 2 * GIB), beat("b", 100)])
    assert why == (
        f"no node has disk room for template big: needs {6 * GIB} bytes "
        f"(with {GIB} headroom), largest room {2 * GIB} bytes on a"
    )
