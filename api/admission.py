"""Admission control (issue 32): a team past its limits is refused at once with 429, E2B's
`{code, message}` body and a `Retry-After`, before any work is sent — never left to wait
until a client's timeout.

Two limits per team (`domain.limits`; settings AENV_TEAM_MAX_SANDBOXES,
AENV_TEAM_CREATES_PER_S and AENV_TEAM_CREATES_BURST, per-team overrides in
AENV_TEAM_LIMITS, per-key overrides set by `aenv keys limits`; key → team → defaults):

- **running sandboxes**: the team's sandboxes holding a VM, read from the read model
  (`projections.census`) plus the ones this API admitted that the read model does not show
  yet (a create before a node claims it, a resume on its way). Within a replica the count
  and the hold are one step (no await between them); a per-team lock makes concurrent
  requests wait for one query and admit on its census (`CENSUS_TTL_S`) instead of each
  querying. Across R replicas a burst can pass the limit by at most what the other
  replicas admitted in the read model's lag plus a create's way to its node's claim
  (docs/scale.md §8 has the bound), since a replica sees the others' admissions only once
  they are in the read model.
- **creates per second** (creates and fork children; a resume starts no new sandbox and
  is not counted): a token bucket kept in NATS KV (`bus.ratebuckets`), so it holds for
  the whole fleet — one KV get and one compare-and-set per create.

What is counted where: a create takes one of each; a fork of `count` children takes
`count` of each; a resume (`POST …/resume`, `POST …/connect` of a paused sandbox) takes a
running slot only. A fleet with no room is a 503 with Retry-After (`api/room.py`), counted
here under `no_room` with the other refusals (`aenv_admission_refusals_total`).
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime

from api.admission_state import AdmissionState
from api.auth import Caller
from api.context import ApiContext, ApiSettings
from api.errors import ApiError
from domain.limits import Effective, Limits, resolve
from projections.census import team_census

__all__ = ["Ticket", "admitted", "limits_for"]

#: How long a sandbox admitted by a request that has ended is still counted by this API if
#: the read model never shows it running (a create answered 504 that goes on in the
#: background, a fork whose answer came before its children's rows).
HELD_S = 30.0
#: Retry-After of a team at its running limit when none of its sandboxes has a TTL ending
#: soon: about what a short rollout step takes.
RUNNING_RETRY_S = 5
#: The longest Retry-After a running-limit refusal names (a TTL an hour away is no hint).
RUNNING_RETRY_MAX_S = 30


def limits_for(settings: ApiSettings, admission: AdmissionState, caller: Caller) -> Effective:
    """What applies to `caller`: its key's overrides, its team's, the settings."""
    default = Limits(
        max_sandboxes=settings.team_max_sandboxes,
        creates_per_s=settings.team_creates_per_s,
        burst=settings.team_creates_burst,
    )
    team = admission.team_limits(settings.team_limits).get(caller.team_id)
    return resolve(caller.team_id, caller.key_id, caller.limits, team, default)


class Ticket:
    """What one admitted request holds: its sandboxes' running slots, until the read
    model shows them (`track` names the ids once known: a fork's children)."""

    def __init__(
        self, admission: AdmissionState, team_id: str, ids: Sequence[str], *, new: bool = True
    ) -> None:
        self.admission, self.team_id, self.ids = admission, team_id, list(ids)
        #: the sandboxes are new ones (a create, a fork), not a resume
        self.new = new

    def track(self, ids: Iterable[str]) -> None:
        """The sandboxes the request made after all (placeholders replaced)."""
        held, new = self.admission.held(self.team_id), self.admission.new(self.team_id)
        for sid in self.ids:
            held.pop(sid, None)
            new.discard(sid)
        self.ids = list(ids)
        for sid in self.ids:
            held[sid] = math.inf
            if self.new:
                new.add(sid)

    def end(self, *, made: bool) -> None:
        """The request ended: its sandboxes count here a while longer if it `made` them
        (until the read model has them), else not at all."""
        held, new = self.admission.held(self.team_id), self.admission.new(self.team_id)
        until = time.monotonic() + HELD_S
        for sid in self.ids:
            if made:
                if sid in held:  # not if a census has counted it meanwhile
                    held[sid] = until
            else:
                held.pop(sid, None)
                new.discard(sid)


@asynccontextmanager
async def admitted(
    ctx: ApiContext, caller: Caller, ids: Sequence[str], *, rate: bool = True
) -> AsyncIterator[Ticket]:
    """Admit a request that starts the sandboxes `ids` (placeholders for ids not known yet)
    or raise 429; refusals of the block (503: no room) are counted. `rate`: the sandboxes
    are new (a create, a fork) and take tokens from the team's bucket."""
    admission = ctx.admission
    limits = limits_for(ctx.settings, admission, caller)
    ticket = Ticket(admission, caller.team_id, (), new=rate)
    if limits.limited:
        if limits.max_sandboxes:  # one census query at a time per team; the others reuse it
            async with admission.lock(caller.team_id):
                await _check_running(ctx, caller, limits, len(ids))
                ticket.track(ids)
        else:
            ticket.track(ids)
        if rate and limits.creates_per_s:  # atomic on its own (compare-and-set): no lock
            try:
                await _take(ctx, caller, limits, len(ids))
            except BaseException:
                ticket.end(made=False)
                raise
    made = False
    try:
        yield ticket
        made = True
    except ApiError as e:
        if e.status == 503:
            ctx.metrics.refused("no_room")
        raise
    except BaseException:
        made = True  # a 504 or a cut: the sandbox may still come up, count it a while
        raise
    finally:
        ticket.end(made=made)


async def _check_running(ctx: ApiContext, caller: Caller, limits: Effective, n: int) -> None:
    team, state = caller.team_id, ctx.admission
    census = state.census(team)  # a quarter-second-old count admits (never refuses)
    if census is not None and census.running + len(state.held(team)) + n <= limits.max_sandboxes:
        return
    census = await team_census(ctx.engine, team, state.held(team).keys())
    state.counted(team, census)
    running = census.running + len(state.held(team))
    if running + n <= limits.max_sandboxes:
        return
    ctx.metrics.refused("running")
    retry = _running_retry(census.soonest_end)
    asked = f"{n} more" if n > 1 else "one more"
    raise ApiError(
        429,
        f"team {team} has {running} sandboxes running and may have {limits.max_sandboxes} "
        f"({limits.max_from}); {asked} is over it: kill or pause one, or retry in {retry} s",
        headers={"Retry-After": str(retry)},
    )


def _running_retry(soonest_end: datetime | None) -> int:
    """Seconds until a running slot is likely free: the first TTL to end, within reason."""
    if soonest_end is None:
        return RUNNING_RETRY_S
    left = (soonest_end - datetime.now(UTC)).total_seconds()
    return max(1, min(RUNNING_RETRY_MAX_S, math.ceil(left)))


async def _take(ctx: ApiContext, caller: Caller, limits: Effective, n: int) -> None:
    buckets = await ctx.admission.buckets(ctx.bus)
    decision = await buckets.take(limits.bucket, rate=limits.creates_per_s, burst=limits.burst, n=n)
    if decision.allowed:
        return
    ctx.metrics.refused("rate")
    retry = max(1, math.ceil(decision.retry_after_s))
    who = f"team {caller.team_id}" + (
        f" (key {caller.key_id})" if limits.bucket.startswith("key.") else ""
    )
    raise ApiError(
        429,
        f"{who} may start {limits.creates_per_s:g} sandboxes per second, {limits.burst} at "
        f"once ({limits.rate_from}); this {'fork' if n > 1 else 'one'} is over it: "
        f"retry in {retry} s",
        headers={"Retry-After": str(retry)},
    )
