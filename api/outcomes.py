"""Send a command and wait for the event that answers it (design §3).

`Bus.send_and_wait` does the work: the answer is read from the log (`bus.answers`: the
process follows every stored sandbox event), registered *before* publishing so it cannot
slip past, and matched on `causation_id` = the command id — never from a plain
subscription, which also delivers appends the stream refused. Here a refusal
(`CommandRejected`) maps to the HTTP error it stands for; silence past the deadline is a
504 naming the command, whose work still completes and shows up later.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from api.errors import ApiError
from bus import Bus
from domain import CommandRejected, Event
from domain import sandbox as sb

REJECTION_STATUS = {
    "not_found": 404,
    "conflict": 409,
    "invalid": 400,
    "permanent": 400,
    "unavailable": 503,
    "forbidden": 403,
}


def failure_status(event: sb.SandboxFailed) -> int:
    """The HTTP status a sandbox that failed to start answers: its code's, else 500."""
    return REJECTION_STATUS.get(event.code, 500) if event.code else 500


async def send_and_wait(
    bus: Bus,
    command: sb.SandboxCommand,
    *,
    node_id: str | None,
    until: tuple[type[Event], ...],
    timeout: float,
    actor: str | None = None,
    unclaimed: Callable[[], Awaitable[None]] | None = None,
    claim_within: float = 0.0,
) -> tuple[Event, int]:
    """`Bus.send_and_wait`, answered in HTTP terms: the event (one of `until`, or a
    failure) with its aggregate version; a rejection as the error it stands for; silence
    as a 504."""
    rec = await bus.send_and_wait(
        command,
        node_id=node_id,
        until=until,
        timeout=timeout,
        actor=actor,
        unclaimed=unclaimed,
        claim_within=claim_within,
    )
    if rec is None:
        raise ApiError(
            504,
            f"command {command.command_id} accepted but not finished within "
            f"{timeout:.0f}s; it continues in the background",
            headers={"Should-Retry": "false"},
        )
    if isinstance(rec.event, CommandRejected):
        raise ApiError(REJECTION_STATUS.get(rec.event.code, 500), rec.event.reason)
    if isinstance(rec.event, sb.SandboxKilled) and sb.SandboxKilled not in until:
        raise ApiError(
            404, f"sandbox {command.sandbox_id} was killed before {type(command).__name__} finished"
        )
    return rec.event, rec.envelope.aggregate_version
