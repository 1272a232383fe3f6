"""The `volumes` read model, folded from volume events with the domain's own `evolve`:
a team's volumes for `GET /volumes` and `aenv volume ls`."""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

from sqlalchemy import Table
from sqlalchemy.ext.asyncio import AsyncConnection

from bus import AggregateKind, RecordedEvent
from domain import volume as vo
from domain.aggregates import VOLUME
from projections.folding import Row, fold_batch, upsert
from projections.tables import volumes

__all__ = ["VolumeProjection", "volume_from_row", "volume_status"]


def volume_status(v: vo.Volume) -> str:
    if v.destroyed:
        return "destroyed"
    return "attached" if v.held else "available"


def _row(v: vo.Volume, rec: RecordedEvent, _prior: Row | None) -> Row:
    version = v.version
    return {
        "volume_id": v.volume_id,
        "team_id": v.team_id,
        "name": v.name,
        "token_sha256": v.token_sha256,
        "incarnation": str(v.incarnation),
        "status": volume_status(v),
        "holder": v.holder,
        "holder_node": v.holder_node,
        "version_key": version.key if version else None,
        "version_size": version.size_bytes if version else None,
        "version_node": version.node_id if version else None,
        "created_at": v.created_at,
        "attached_at": v.attached_at,
        "updated_at": rec.time,
    }


def volume_from_row(r: Row) -> vo.Volume:
    """The state a row was written from (minus the write side's recent command ids)."""
    version = None
    if r["version_key"] is not None:
        version = vo.VolumeVersion(
            key=r["version_key"], size_bytes=r["version_size"] or 0, node_id=r["version_node"]
        )
    return vo.Volume(
        volume_id=r["volume_id"],
        team_id=r["team_id"],
        name=r["name"],
        token_sha256=r["token_sha256"],
        incarnation=UUID(r["incarnation"]),
        created_at=r["created_at"],
        destroyed=r["status"] == "destroyed",
        holder=r["holder"],
        holder_node=r["holder_node"],
        attached_at=r["attached_at"],
        version=version,
    )


class VolumeProjection:
    """Volumes, one row each (destroyed ones stay, marked: a name may be created again)."""

    name: str = "volumes"
    kind: AggregateKind = VOLUME.kind
    tables: tuple[Table, ...] = (volumes,)

    async def apply(self, conn: AsyncConnection, batch: Sequence[RecordedEvent]) -> None:
        rows = await fold_batch(
            conn,
            volumes,
            "volume_id",
            batch,
            evolve=VOLUME.evolve,
            from_row=volume_from_row,
            to_row=_row,
        )
        await upsert(conn, volumes, "volume_id", rows)
