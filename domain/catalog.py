"""The closed sets of command and event types, by wire name, gathered from the aggregates.

The bus's registry is built from these; a message type that is not listed here cannot be
published or read. Names are the class names and never change (add a new type instead).
Each type is owned by one aggregate's entry in `domain.aggregates`; `CommandRejected` is
everyone's (a refusal goes to the subject of whichever aggregate was addressed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from domain.aggregates import AGGREGATES
from domain.messages import Command, CommandRejected, Event, Message

__all__ = ["COMMAND_TYPES", "EVENT_TYPES", "EVENT_UPCASTERS"]

M = TypeVar("M", bound=Message)


def _by_name(*classes: type[M]) -> dict[str, type[M]]:
    names = {cls.__name__: cls for cls in classes}
    if len(names) != len(classes):  # two kinds claiming one type: a registration mistake
        raise ValueError("a message type is registered twice")
    return names


COMMAND_TYPES: dict[str, type[Command]] = _by_name(*(c for a in AGGREGATES for c in a.commands))

EVENT_TYPES: dict[str, type[Event]] = _by_name(
    *(e for a in AGGREGATES for e in a.events), CommandRejected
)

#: Pure payload upgrades, one schema version step each: (type, from version) → function. The
#: bus runs them when it reads an older event (fields are moved, never lost).
EVENT_UPCASTERS: dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]] = {
    key: upcast for a in AGGREGATES for key, upcast in a.upcasters.items()
}
