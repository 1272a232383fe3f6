"""The `build_keys` read model, folded from build key events with the domain's own
`evolve`: which build of a template ran for its identical builds, and which joined it (what
`aenv events` and an operator read to see that eight racing builds ran one sandbox)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Table
from sqlalchemy.ext.asyncio import AsyncConnection

from bus import AggregateKind, RecordedEvent
from domain import buildkey as bk
from domain.aggregates import BUILDKEY
from projections.folding import Row, fold_batch, upsert
from projections.tables import build_keys

__all__ = ["BuildKeyProjection", "build_key_from_row"]


def _status(k: bk.BuildKey) -> str:
    if not k.settled:
        return "building"
    return "ready" if k.ready else "error"


def _row(k: bk.BuildKey, rec: RecordedEvent, _prior: Row | None) -> Row:
    return {
        "key_id": k.key_id,
        "template_id": k.template_id,
        "generation": k.generation,
        "leader_build_id": k.leader,
        "followers": list(k.followers),
        "status": _status(k),
        "capture_id": k.capture_id,
        "reason": k.error,
        "failed_step": k.step,
        "settled_at": k.settled_at,
        "updated_at": rec.time,
    }


def build_key_from_row(r: Row) -> bk.BuildKey:
    """The state a row was written from."""
    return bk.BuildKey(
        key_id=r["key_id"],
        template_id=r["template_id"],
        generation=r["generation"],
        leader=r["leader_build_id"],
        followers=tuple(r["followers"]),
        settled=r["status"] != "building",
        error=r["reason"],
        step=r["failed_step"],
        capture_id=r["capture_id"],
        settled_at=r["settled_at"],
    )


class BuildKeyProjection:
    """Build keys, one row each (the current generation)."""

    name: str = "build_keys"
    kind: AggregateKind = BUILDKEY.kind
    tables: tuple[Table, ...] = (build_keys,)

    async def apply(self, conn: AsyncConnection, batch: Sequence[RecordedEvent]) -> None:
        rows = await fold_batch(
            conn,
            build_keys,
            "key_id",
            batch,
            evolve=BUILDKEY.evolve,
            from_row=build_key_from_row,
            to_row=_row,
        )
        await upsert(conn, build_keys, "key_id", rows)
