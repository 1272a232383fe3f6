"""Load → decide → append for the sandbox aggregate, retried on concurrency conflicts.

Used by every writer (node worker, API for state-only changes, timer): a conflict means
someone appended first, so we reload and decide again on the newer state rather than
overwrite it.
"""

from __future__ import annotations

from bus.envelope import MessageContext
from bus.errors import ConcurrencyError, RetryableError
from bus.store import EventStore, Version
from domain import sandbox as sb
from domain import template as tp
from domain.errors import DomainError
from domain.messages import Event

__all__ = ["apply", "record_template_upload", "register_template"]

ATTEMPTS = 8


async def apply(
    store: EventStore[sb.Sandbox],
    command: sb.SandboxCommand,
    context: MessageContext | None = None,
    *,
    known: tuple[sb.Sandbox | None, Version] | None = None,
) -> tuple[sb.Sandbox | None, Version, list[Event]]:
    """Decide `command` on the latest state and append the result: (new state, version,
    appended events). Domain errors propagate to the caller.

    The first attempt decides on a state we already hold, without reading the stream:
    `known` (the caller's previous `apply`), else this process's last fold of the
    aggregate, else — for a create — the empty aggregate. That costs nothing when it is
    still current (the usual case: the node appended the pause it now resumes from) and
    is safe when it is not: an append on a stale version fails on the expected sequence,
    and a stale state that decides nothing or rejects the command is checked against a
    fresh load before anyone is told so.
    """
    guess = known or store.cached(command.sandbox_id)
    if guess is None and isinstance(command, sb.CreateSandbox):
        guess = (None, EventStore.NEW)
    for attempt in range(ATTEMPTS):
        optimistic = attempt == 0 and guess is not None
        if optimistic:
            state, version = guess  # type: ignore[misc]
        else:
            state, version = await store.load(command.sandbox_id)
        try:
            events: list[Event] = list(sb.decide(state, command))
        except DomainError:
            if optimistic:
                continue
            raise
        if not events:
            if optimistic:
                continue
            return state, version, []
        try:
            version = await store.append(command.sandbox_id, version, events, context=context)
        except ConcurrencyError:
            continue
        for event in events:
            state = sb.evolve(state, event)
        return state, version, events
    raise RetryableError(f"sandbox {command.sandbox_id}: too many concurrent writers")


async def register_template(
    store: EventStore[tp.Template],
    template_id: str,
    *,
    alias: str | None,
    envd_version: str,
    cpu_count: int,
    memory_mb: int,
    disk_size_mb: int,
    capture_id: str | None = None,
    context: MessageContext | None = None,
) -> None:
    """Make a template creatable (idempotent upsert: no event when nothing changes)."""
    cmd = tp.RegisterTemplate(
        template_id=template_id, alias=alias, envd_version=envd_version,
        cpu_count=cpu_count, memory_mb=memory_mb, disk_size_mb=disk_size_mb,
        capture_id=capture_id,
    )  # fmt: skip
    await _apply_template(store, template_id, cmd, context)


async def record_template_upload(
    store: EventStore[tp.Template], template_id: str, *, key: str, source_sandbox_id: str
) -> None:
    """A snapshot template's capture is durable under `key` (once per capture)."""
    cmd = tp.RecordTemplateUpload(template_id=template_id, key=key,
                                  source_sandbox_id=source_sandbox_id)  # fmt: skip
    await _apply_template(store, template_id, cmd, None)


async def _apply_template(
    store: EventStore[tp.Template], template_id: str,
    cmd: tp.RegisterTemplate | tp.RecordTemplateUpload, context: MessageContext | None,
) -> None:  # fmt: skip
    for _ in range(ATTEMPTS):
        state, version = await store.load(template_id)
        events = tp.decide_template(state, cmd)
        if not events:
            return
        try:
            await store.append(template_id, version, events, context=context)
            return
        except ConcurrencyError:
            continue
    raise RetryableError(f"template {template_id}: too many concurrent writers")
