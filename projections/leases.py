"""The `leases` read model, folded from lease events with the domain's own `evolve`: what
`GET /leases` lists and what the lease timer scans for deadlines and sweeps."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Table
from sqlalchemy.ext.asyncio import AsyncConnection

from bus import AggregateKind, RecordedEvent
from domain import lease as ls
from domain.aggregates import LEASE
from projections.folding import Row, fold_batch, upsert
from projections.tables import leases

__all__ = ["LeaseProjection", "lease_from_row"]


def _row(lease: ls.Lease, rec: RecordedEvent, _prior: Row | None) -> Row:
    return {
        "lease_id": lease.lease_id,
        "team_id": lease.team_id,
        "ttl_s": lease.ttl_s,
        "on_expiry": lease.on_expiry,
        "status": lease.status.value,
        "opened_at": lease.opened_at,
        "expires_at": lease.expires_at,
        "ended_at": lease.ended_at,
        "updated_at": rec.time,
    }


def lease_from_row(r: Row) -> ls.Lease:
    """The state a row was written from."""
    return ls.Lease(
        lease_id=r["lease_id"],
        team_id=r["team_id"],
        ttl_s=r["ttl_s"],
        on_expiry=r["on_expiry"],
        status=ls.LeaseStatus(r["status"]),
        opened_at=r["opened_at"],
        expires_at=r["expires_at"],
        ended_at=r["ended_at"],
    )


class LeaseProjection:
    """Leases, one row each."""

    name: str = "leases"
    kind: AggregateKind = LEASE.kind
    tables: tuple[Table, ...] = (leases,)

    async def apply(self, conn: AsyncConnection, batch: Sequence[RecordedEvent]) -> None:
        rows = await fold_batch(
            conn,
            leases,
            "lease_id",
            batch,
            evolve=LEASE.evolve,
            from_row=lease_from_row,
            to_row=_row,
        )
        await upsert(conn, leases, "lease_id", rows)
