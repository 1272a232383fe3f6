"""The fleet as `aenv status` shows it: every node that beats (or stopped beating), its
room, accelerator and sandboxes, from the nodes bucket — what placement itself reads. Works
on any machine that reaches NATS (`stack.json`'s, or `AENV_NATS_URL`'s on a fleet)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the server's packages load only when the command runs
    from bus.nodes import Heartbeat

__all__ = ["fleet_view", "read_beats"]


def fleet_view(beats: Iterable[Heartbeat], now: float) -> dict[str, Any]:
    """Nodes with their room and sandboxes, totals, placement skew (`bus.nodes.fleet_view`,
    which the web console shows too)."""
    from bus.nodes import fleet_view as view

    return view(beats, now)


async def read_beats(nats_url: str) -> list[Heartbeat]:
    """Every heartbeat in the nodes bucket now."""
    from bus import Bus, BusSettings
    from bus.nodes import NodeBook

    bus = await Bus.connect(BusSettings(nats_url=nats_url), setup=False, retry=False)
    try:
        return await (await NodeBook.open(bus.js, bus.names.nodes_bucket)).all()
    finally:
        await bus.close()
