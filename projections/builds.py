"""The template build read models: `template_builds` (one row per build, folded with the
domain's `evolve_build`) and `template_build_logs` (one row per log entry).

Log rows are keyed by (build, index) and inserted with ON CONFLICT DO NOTHING: an event
replayed after a crash, or by a rebuild, writes the same rows again and changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Table
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from bus import AggregateKind, RecordedEvent
from domain import build as bd
from domain.aggregates import BUILD
from projections.folding import Row, fold_batch, upsert
from projections.tables import build_logs, builds

__all__ = ["BuildProjection"]

_STATE_FIELDS = (
    "build_id",
    "template_id",
    "alias",
    "team_id",
    "cpu_count",
    "memory_mb",
    "disk_size_mb",
    "node_id",
    "reason",
    "failed_step",
    "sandbox_id",
    "envd_version",
    "log_count",
    "discarded",
    "requested_at",
    "started_at",
    "finished_at",
)


def _row(b: bd.Build, rec: RecordedEvent, _prior: Row | None) -> Row:
    row: Row = {f: getattr(b, f) for f in _STATE_FIELDS}
    row["status"] = b.status.value
    row["spec"] = b.spec.model_dump(mode="json") if b.spec is not None else None
    row["updated_at"] = rec.time
    return row


def _from_row(r: Row) -> bd.Build:
    fields: dict[str, Any] = {f: r[f] for f in _STATE_FIELDS}
    spec = bd.BuildSpec.model_validate(r["spec"]) if r["spec"] is not None else None
    return bd.Build(**fields, status=bd.BuildStatus(r["status"]), spec=spec)


class BuildProjection:
    """Template builds for the status, list and template routes."""

    name: str = "template_builds"
    kind: AggregateKind = BUILD.kind
    tables: tuple[Table, ...] = (builds, build_logs)

    async def apply(self, conn: AsyncConnection, batch: Sequence[RecordedEvent]) -> None:
        rows = await fold_batch(
            conn,
            builds,
            "build_id",
            batch,
            evolve=BUILD.evolve,
            from_row=_from_row,
            to_row=_row,
        )
        await upsert(conn, builds, "build_id", rows)
        lines = [
            {
                "build_id": rec.event.build_id,
                "idx": rec.event.first_index + i,
                "at": e.at,
                "level": e.level,
                "step": e.step,
                "message": e.message,
            }
            for rec in batch
            if isinstance(rec.event, bd.TemplateBuildLogged)
            for i, e in enumerate(rec.event.entries)
        ]
        if lines:
            await conn.execute(insert(build_logs).on_conflict_do_nothing(), lines)
