"""The one way a command becomes history: load → decide → append, decided again on a
concurrency conflict. Every writer uses it — the node worker, the API's TTL changes and
template deletes, the template builder, API-key admin — for every aggregate kind (the
store brings the aggregate's `decide` and `evolve`).

A conflict means someone appended first, so we reload and decide again on the newer state
rather than overwrite it. Event ids derive from the causing command (`causation_id`, the
command's own id unless the caller's context names the request it completes), so a command
executed twice appends the same message and JetStream stores it once.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Generic, NamedTuple, TypeVar

from pydantic import BaseModel

from bus.envelope import MessageContext
from bus.errors import ConcurrencyError, RetryableError
from bus.store import EventStore, Version
from domain import Command, DomainError, Event

__all__ = ["ATTEMPTS", "Decided", "execute"]

ATTEMPTS = 8

S = TypeVar("S", bound=BaseModel)  # an aggregate state (never None: that is "no aggregate")
T = TypeVar("T")
C = TypeVar("C", bound=Command)


class Decided(NamedTuple, Generic[T]):
    """What `execute` left behind: the state after it, its version, what it appended."""

    state: T
    version: Version
    events: list[Event]


async def execute(
    store: EventStore[S, C],
    command: C,
    context: MessageContext | None = None,
    *,
    known: tuple[Any, Version] | None = None,
) -> Decided[S | None]:
    """Decide `command` on the aggregate's latest state and append the result (at most one
    event: JetStream before 2.12 has no atomic batch, so that is what keeps an append
    atomic). Domain errors propagate to the caller.

    The first attempt decides on a state we already hold, without reading the stream:
    `known` (the caller's previous `execute`), else this process's last fold of the
    aggregate, else — for a command that `creates` one — the empty aggregate. That costs
    nothing when it is still current (the usual case: the node appended the pause it now
    resumes from) and is safe when it is not: an append on a stale version fails on the
    expected sequence, and a stale state that decides nothing or rejects the command is
    checked against a fresh load before anyone is told so.
    """
    aggregate_id = command.aggregate_id
    ctx = _caused(context, command)
    guess = known or store.cached(aggregate_id)
    if guess is None and command.creates:
        guess = (None, EventStore.NEW)
    for attempt in range(ATTEMPTS):
        optimistic = attempt == 0 and guess is not None
        if optimistic:
            state, version = guess  # type: ignore[misc]
        else:
            state, version = await store.load(aggregate_id)
        try:
            events = list(store.decide(state, command))
        except DomainError:
            if optimistic:
                continue
            raise
        if len(events) > 1:
            raise AssertionError(f"{type(command).__name__} decided {len(events)} events")
        if not events:
            if optimistic:
                continue
            return Decided(state, version, [])
        try:
            version = await store.append(aggregate_id, version, events, context=ctx)
        except ConcurrencyError:
            continue
        return Decided(store.evolve(state, events[0]), version, events)
    raise RetryableError(f"{command.aggregate} {aggregate_id}: too many concurrent writers")


def _caused(context: MessageContext | None, command: Command) -> MessageContext:
    """The context the events are appended with: the caller's (a worker's: caused by the
    request it handles), else caused by `command` itself — never no cause, which would
    make the event id random and a retried command append twice."""
    ctx = context or MessageContext()
    if ctx.causation_id is not None:
        return ctx
    return dataclasses.replace(
        ctx,
        causation_id=command.command_id,
        correlation_id=ctx.correlation_id or command.command_id,
    )
