"""The `node_cordons` read model, folded from node events with the domain's own `evolve`:
which nodes an operator cordoned, and why (what `aenv node` and the console list)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Table
from sqlalchemy.ext.asyncio import AsyncConnection

from bus import AggregateKind, RecordedEvent
from domain import node as nd
from domain.aggregates import NODE
from projections.folding import Row, fold_batch, upsert
from projections.tables import node_cordons

__all__ = ["NodeCordonProjection", "node_from_row"]


def _row(n: nd.Node, rec: RecordedEvent, _prior: Row | None) -> Row:
    return {
        "node_id": n.node_id,
        "cordoned": n.cordoned,
        "reason": n.reason,
        "cordoned_at": n.cordoned_at,
        "updated_at": rec.time,
    }


def node_from_row(r: Row) -> nd.Node:
    """The state a row was written from."""
    return nd.Node(
        node_id=r["node_id"],
        cordoned=r["cordoned"],
        reason=r["reason"],
        cordoned_at=r["cordoned_at"],
    )


class NodeCordonProjection:
    """Node cordons, one row per node an operator addressed."""

    name: str = "node_cordons"
    kind: AggregateKind = NODE.kind
    tables: tuple[Table, ...] = (node_cordons,)

    async def apply(self, conn: AsyncConnection, batch: Sequence[RecordedEvent]) -> None:
        rows = await fold_batch(
            conn,
            node_cordons,
            "node_id",
            batch,
            evolve=NODE.evolve,
            from_row=node_from_row,
            to_row=_row,
        )
        await upsert(conn, node_cordons, "node_id", rows)
