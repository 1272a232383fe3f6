"""The lease aggregate: a dead-man switch over a set of sandboxes (issue 32).

A trainer opens a lease (`OpenLease`: a TTL and what its expiry does, kill or pause),
creates its sandboxes under it (the metadata key `LEASE_KEY` names the lease; the API
checks the lease is the team's and live) and renews it (`RenewLease`) while it runs. A
lease not renewed within its TTL expires (`ExpireLease`, the timer's) and every sandbox
whose metadata names it is killed — or paused, if the lease said so; a lease the client
ends (`EndLease`) kills its sandboxes at once. So a trainer that crashes leaves nothing
running longer than the TTL, with no per-sandbox call.

Membership is not stored here: it is the sandboxes' own metadata (the read model finds
them, as a bulk kill by metadata does). The lease only orders time: a renewal and an
expiry are both decided on the lease's stream, so one wins — a renewal after the deadline
is refused even if the timer has not acted yet, and an expiry decided on a state renewed
since decides nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from enum import StrEnum
from functools import reduce
from typing import ClassVar, Literal, assert_never

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from domain.errors import Conflict, CorruptHistory, Invalid, NotFound
from domain.messages import Command, CommandRejected, Event

__all__ = [
    "LEASE_KEY",
    "MAX_TTL_S",
    "MIN_TTL_S",
    "SWEEP_AFTER_END_S",
    "AnyLeaseCommand",
    "AnyLeaseEvent",
    "EndLease",
    "ExpireLease",
    "Lease",
    "LeaseCommand",
    "LeaseEnded",
    "LeaseExpired",
    "LeaseOpened",
    "LeaseRenewed",
    "LeaseStatus",
    "OnExpiry",
    "OpenLease",
    "RenewLease",
    "check_ttl",
    "decide_lease",
    "evolve_lease",
    "fold_lease",
    "member_action",
]

#: The sandbox metadata key naming the lease a sandbox lives under.
LEASE_KEY = "aenv.lease"
#: A lease's TTL bounds: a second (a test's) up to a day (a renewal is one cheap call).
MIN_TTL_S = 1.0
MAX_TTL_S = 86_400.0
#: How long after its end the timer keeps sweeping a lease's sandboxes: a create that
#: checked the lease just before it ended lands in the read model a moment later, and a
#: create waits for its node at most a few minutes.
SWEEP_AFTER_END_S = 300.0

OnExpiry = Literal["kill", "pause"]


class LeaseStatus(StrEnum):
    ACTIVE = "active"
    #: not renewed in time: its sandboxes were killed or paused (`on_expiry`)
    EXPIRED = "expired"
    #: ended by its client: its sandboxes were killed
    ENDED = "ended"


class LeaseCommand(Command):
    """A command addressed to one lease."""

    aggregate: ClassVar[str] = "lease"
    aggregate_field: ClassVar[str] = "lease_id"

    lease_id: str = Field(min_length=1, max_length=64)


class OpenLease(LeaseCommand):
    """Open a lease for `team_id`, expiring `ttl_s` after now unless renewed."""

    creates: ClassVar[bool] = True

    team_id: str
    ttl_s: float
    on_expiry: OnExpiry = "kill"


class RenewLease(LeaseCommand):
    """Push the deadline to now + TTL (`ttl_s`: a new TTL, else the lease's own)."""

    ttl_s: float | None = None


class ExpireLease(LeaseCommand):
    """The timer's: the lease's deadline passed (`at` is the timer's clock)."""


class EndLease(LeaseCommand):
    """The client's: end the lease now, killing its sandboxes."""


class LeaseOpened(Event):
    lease_id: str
    team_id: str
    ttl_s: float
    on_expiry: OnExpiry
    expires_at: AwareDatetime


class LeaseRenewed(Event):
    lease_id: str
    ttl_s: float
    expires_at: AwareDatetime


class LeaseExpired(Event):
    lease_id: str


class LeaseEnded(Event):
    lease_id: str


class Lease(BaseModel):
    model_config = ConfigDict(frozen=True)

    lease_id: str
    team_id: str
    ttl_s: float
    on_expiry: OnExpiry = "kill"
    status: LeaseStatus = LeaseStatus.ACTIVE
    opened_at: AwareDatetime
    expires_at: AwareDatetime
    #: when it expired or was ended (None while active)
    ended_at: AwareDatetime | None = None


AnyLeaseCommand = OpenLease | RenewLease | ExpireLease | EndLease
AnyLeaseEvent = LeaseOpened | LeaseRenewed | LeaseExpired | LeaseEnded


def check_ttl(ttl_s: float) -> None:
    if not MIN_TTL_S <= ttl_s <= MAX_TTL_S:
        raise Invalid(f"lease ttl {ttl_s:g} s is out of range {MIN_TTL_S:g}..{MAX_TTL_S:g} s")


def _deadline(at: datetime, ttl_s: float) -> datetime:
    return at + timedelta(seconds=ttl_s)


def _live(state: Lease | None, lease_id: str, at: datetime) -> Lease:
    """The lease, if it is live at `at` (a renewal's clock)."""
    if state is None:
        raise NotFound(f"no lease {lease_id}")
    if state.status is not LeaseStatus.ACTIVE:
        raise Conflict(f"lease {lease_id} is {state.status.value}")
    if at >= state.expires_at:
        raise Conflict(f"lease {lease_id} expired at {state.expires_at.isoformat()}")
    return state


def decide_lease(state: Lease | None, command: AnyLeaseCommand) -> list[Event]:
    match command:
        case OpenLease():
            if state is not None:
                raise Conflict(f"lease {command.lease_id} exists")
            check_ttl(command.ttl_s)
            return [
                LeaseOpened(
                    lease_id=command.lease_id,
                    team_id=command.team_id,
                    ttl_s=command.ttl_s,
                    on_expiry=command.on_expiry,
                    expires_at=_deadline(command.at, command.ttl_s),
                    at=command.at,
                )
            ]
        case RenewLease():
            lease = _live(state, command.lease_id, command.at)
            ttl = command.ttl_s if command.ttl_s is not None else lease.ttl_s
            check_ttl(ttl)
            return [
                LeaseRenewed(
                    lease_id=command.lease_id,
                    ttl_s=ttl,
                    expires_at=_deadline(command.at, ttl),
                    at=command.at,
                )
            ]
        case ExpireLease():
            if state is None:
                raise NotFound(f"no lease {command.lease_id}")
            # ended already, or renewed since the timer looked: nothing to do
            if state.status is not LeaseStatus.ACTIVE or command.at < state.expires_at:
                return []
            return [LeaseExpired(lease_id=command.lease_id, at=command.at)]
        case EndLease():
            if state is None:
                raise NotFound(f"no lease {command.lease_id}")
            if state.status is LeaseStatus.ENDED:
                return []
            return [LeaseEnded(lease_id=command.lease_id, at=command.at)]
        case _:
            assert_never(command)


def evolve_lease(state: Lease | None, event: Event) -> Lease | None:
    if isinstance(event, CommandRejected):
        return state
    if not isinstance(event, LeaseOpened | LeaseRenewed | LeaseExpired | LeaseEnded):
        raise CorruptHistory(f"not a lease event: {type(event).__name__}")
    if isinstance(event, LeaseOpened):
        return Lease(
            lease_id=event.lease_id,
            team_id=event.team_id,
            ttl_s=event.ttl_s,
            on_expiry=event.on_expiry,
            opened_at=event.at,
            expires_at=event.expires_at,
        )
    if state is None:
        raise CorruptHistory(f"{type(event).__name__} before LeaseOpened")
    match event:
        case LeaseRenewed():
            return state.model_copy(update={"ttl_s": event.ttl_s, "expires_at": event.expires_at})
        case LeaseExpired():
            return state.model_copy(update={"status": LeaseStatus.EXPIRED, "ended_at": event.at})
        case LeaseEnded():
            # an expired lease ended later is swept again from now, for its kills
            return state.model_copy(update={"status": LeaseStatus.ENDED, "ended_at": event.at})
        case _:
            assert_never(event)


def fold_lease(events: Iterable[Event], state: Lease | None = None) -> Lease | None:
    return reduce(evolve_lease, events, state)


def member_action(state: Lease) -> Literal["kill", "pause"] | None:
    """What a lease's end does to its sandboxes: None while it is active; a client's end
    kills them; an expiry does what the lease was opened with."""
    match state.status:
        case LeaseStatus.ACTIVE:
            return None
        case LeaseStatus.ENDED:
            return "kill"
        case LeaseStatus.EXPIRED:
            return state.on_expiry
        case _:
            assert_never(state.status)
