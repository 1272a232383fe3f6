"""Load → decide → append for the sandbox aggregate, retried on concurrency conflicts.

Used by every writer (node worker, API for state-only changes, timer): a conflict means
someone appended first, so we reload and decide again on the newer state rather than
overwrite it.
"""

from __future__ import annotations

from aenv.domain import sandbox as sb
from aenv.domain.messages import Event
from bus.envelope import MessageContext
from bus.errors import ConcurrencyError, RetryableError
from bus.store import EventStore, Version

__all__ = ["apply"]

ATTEMPTS = 8


async def apply(
    store: EventStore[sb.Sandbox],
    command: sb.SandboxCommand,
    context: MessageContext | None = None,
) -> tuple[sb.Sandbox | None, Version, list[Event]]:
    """Decide `command` on the latest state and append the result: (new state, version,
    appended events). Domain errors propagate to the caller."""
    for _ in range(ATTEMPTS):
        state, version = await store.load(command.sandbox_id)
        events: list[Event] = list(sb.decide(state, command))
        if not events:
            return state, version, []
        try:
            version = await store.append(command.sandbox_id, version, events, context=context)
        except ConcurrencyError:
            continue
        for event in events:
            state = sb.evolve(state, event)
        return state, version, events
    raise RetryableError(f"sandbox {command.sandbox_id}: too many concurrent writers")
