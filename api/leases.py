"""Leases (not in E2B's API; issue 32): `POST /leases` opens one, `POST /leases/{id}/renew`
keeps every sandbox created under it alive, `GET /leases[/{id}]` shows them, `DELETE
/leases/{id}` ends one and kills its sandboxes. A sandbox joins a lease by its create's
metadata (`aenv.lease`: the lease id), checked here (`check_create`) before the create
goes anywhere. Expiry is the lease timer's (`workers.timer.leases`).

The lease's own state is read from the log (the read model lags a renewal); its sandbox
count from the read model.
"""

from __future__ import annotations

import re
import secrets
from typing import Any, Literal

from litestar import Response, delete, get, post
from pydantic import BaseModel, ConfigDict, Field

from api import bulk
from api.auth import Caller
from api.context import ApiContext
from api.errors import ERRORS, ApiError
from bus import MessageContext
from bus.decisions import execute
from domain import lease as ls
from domain import utcnow
from projections import leasequeries
from projections.leases import lease_from_row

__all__ = ["ROUTES", "check_create", "lease_view"]

_LEASE_ID = re.compile(r"[a-z0-9-]{1,64}")


class NewLease(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    #: seconds the lease lives unless renewed (`ls.MIN_TTL_S`..`ls.MAX_TTL_S`, else 400)
    ttl: float
    on_expiry: Literal["kill", "pause"] = Field(default="kill", alias="onExpiry")


class RenewBody(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: a new TTL from now on; absent: the lease's own
    ttl: float | None = None


def lease_view(lease: ls.Lease, sandboxes: int) -> dict[str, Any]:
    return {
        "leaseID": lease.lease_id,
        "ttl": lease.ttl_s,
        "onExpiry": lease.on_expiry,
        "state": lease.status.value,
        "openedAt": lease.opened_at.isoformat(),
        "expiresAt": lease.expires_at.isoformat(),
        "endedAt": lease.ended_at.isoformat() if lease.ended_at else None,
        "sandboxes": sandboxes,
    }


async def _count(ctx: ApiContext, team_id: str, lease_id: str) -> int:
    async with ctx.engine.connect() as conn:
        counts = await leasequeries.lease_member_counts(conn, team_id, [lease_id])
    return counts.get(lease_id, 0)


async def _owned(ctx: ApiContext, caller: Caller, lease_id: str) -> ls.Lease:
    """The caller's lease, from the log; another team's is as absent as a missing one."""
    if _LEASE_ID.fullmatch(lease_id):
        state, _ = await ctx.bus.leases.load(lease_id)
        if state is not None and state.team_id == caller.team_id:
            return state
    raise ApiError(404, f"no lease {lease_id}")


async def check_create(ctx: ApiContext, caller: Caller, metadata: dict[str, str] | None) -> None:
    """A create naming a lease in its metadata: the lease must be the caller's team's
    (400 otherwise: no such lease) and live (409: it expired or ended). A create that
    passes just before the lease ends is killed by the lease's sweep once it lands."""
    lease_id = (metadata or {}).get(ls.LEASE_KEY)
    if lease_id is None:
        return
    try:
        lease = await _owned(ctx, caller, lease_id)
    except ApiError:
        raise ApiError(
            400, f"metadata {ls.LEASE_KEY}={lease_id!r} names no lease of this team"
        ) from None
    if lease.status is not ls.LeaseStatus.ACTIVE or utcnow() >= lease.expires_at:
        past_deadline = lease.status is ls.LeaseStatus.ACTIVE  # the timer acts within a second
        word = ls.LeaseStatus.EXPIRED.value if past_deadline else lease.status.value
        when = (lease.ended_at or lease.expires_at).isoformat()
        raise ApiError(
            409, f"lease {lease_id} is {word} (since {when}): no sandbox is created under it"
        )


@post("/leases", status_code=201, responses=ERRORS)
async def open_lease(ctx: ApiContext, caller: Caller, data: NewLease) -> dict[str, Any]:
    """Open a lease: its sandboxes live while it is renewed within `ttl` seconds."""
    lease_id = f"lease-{secrets.token_hex(8)}"
    cmd = ls.OpenLease(
        lease_id=lease_id, team_id=caller.team_id, ttl_s=data.ttl, on_expiry=data.on_expiry
    )
    decided = await execute(ctx.bus.leases, cmd, MessageContext(actor=caller.key_id))
    assert decided.state is not None
    return lease_view(decided.state, 0)


@post("/leases/{lease_id:str}/renew", status_code=200, responses=ERRORS)
async def renew_lease(
    ctx: ApiContext, caller: Caller, lease_id: str, data: RenewBody | None = None
) -> dict[str, Any]:
    """Push the lease's deadline to now + its TTL (or `ttl`); 409 once it expired."""
    await _owned(ctx, caller, lease_id)
    cmd = ls.RenewLease(lease_id=lease_id, ttl_s=data.ttl if data else None)
    decided = await execute(ctx.bus.leases, cmd, MessageContext(actor=caller.key_id))
    assert decided.state is not None
    return lease_view(decided.state, await _count(ctx, caller.team_id, lease_id))


@get("/leases/{lease_id:str}", responses=ERRORS)
async def get_lease(ctx: ApiContext, caller: Caller, lease_id: str) -> dict[str, Any]:
    lease = await _owned(ctx, caller, lease_id)
    await ctx.fenced_to_tail()
    return lease_view(lease, await _count(ctx, caller.team_id, lease_id))


@get("/leases", responses=ERRORS)
async def list_leases(ctx: ApiContext, caller: Caller) -> list[dict[str, Any]]:
    """The team's leases, newest first (the read model's: a renewal shows a moment later)."""
    await ctx.fenced_to_tail()
    async with ctx.engine.connect() as conn:
        rows = await leasequeries.team_leases(conn, caller.team_id)
        counts = await leasequeries.lease_member_counts(
            conn, caller.team_id, [r["lease_id"] for r in rows]
        )
    return [lease_view(lease_from_row(r), counts.get(r["lease_id"], 0)) for r in rows]


@delete("/leases/{lease_id:str}", status_code=200, responses=ERRORS)
async def end_lease(ctx: ApiContext, caller: Caller, lease_id: str) -> Response[dict[str, Any]]:
    """End the lease and kill its sandboxes now (the answer names them); a create racing
    the end is killed by the lease timer's sweep."""
    await _owned(ctx, caller, lease_id)
    cmd = ls.EndLease(lease_id=lease_id)
    await execute(ctx.bus.leases, cmd, MessageContext(actor=caller.key_id))
    done = await bulk.run(ctx, caller, {ls.LEASE_KEY: lease_id}, "kill")
    return Response({"leaseID": lease_id, **done.wire()}, status_code=200)


ROUTES = [open_lease, renew_lease, get_lease, list_leases, end_lease]
