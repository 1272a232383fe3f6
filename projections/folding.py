"""Batch folding of aggregate events into one row per aggregate, with guarded upserts.

A projection whose rows mirror aggregate states reuses the domain's own `evolve`: the row is
rebuilt into the state, the event folded in, the state written back. The read model can
therefore never disagree with what the write side decides on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from sqlalchemy import Table, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from bus import RecordedEvent
from domain import Event

__all__ = ["Row", "fold_batch", "load_rows", "upsert"]

S = TypeVar("S")
Row = dict[str, Any]


async def load_rows(conn: AsyncConnection, table: Table, key: str, ids: set[str]) -> dict[str, Row]:
    if not ids:
        return {}
    result = await conn.execute(select(table).where(table.c[key].in_(sorted(ids))))
    return {r[key]: dict(r) for r in result.mappings()}


async def fold_batch(
    conn: AsyncConnection,
    table: Table,
    key: str,
    batch: Sequence[RecordedEvent],
    *,
    evolve: Callable[[S | None, Event], S | None],
    from_row: Callable[[Row], S],
    to_row: Callable[[S, RecordedEvent, Row | None], Row],
) -> dict[str, Row]:
    """Rows changed by `batch`, keyed by aggregate id, each at the revision of its last event.

    Events at or below a row's stored revision are skipped: they are already folded in (a
    replay after a crash, or a rebuild overlapping the live projection).
    """
    existing = await load_rows(conn, table, key, {r.envelope.aggregate_id for r in batch})
    states: dict[str, S] = {k: from_row(r) for k, r in existing.items()}
    revisions = {k: int(r["revision"]) for k, r in existing.items()}
    changed: dict[str, Row] = {}
    for rec in batch:
        agg, rev = rec.envelope.aggregate_id, rec.envelope.aggregate_version
        if revisions.get(agg, 0) >= rev:
            continue
        revisions[agg] = rev
        state = evolve(states.get(agg), rec.event)
        if state is None:  # e.g. a rejection of a command on an aggregate that never existed
            continue
        states[agg] = state
        row = to_row(state, rec, changed.get(agg) or existing.get(agg))
        row |= {key: agg, "revision": rev, "last_seq": rec.seq}
        changed[agg] = row
    return changed


async def upsert(
    conn: AsyncConnection,
    table: Table,
    key: str,
    rows: Mapping[str, Row],
    *,
    guard: str = "revision",
) -> None:
    """Insert or update `rows`, never moving a stored row back to an older `guard` value.

    `revision` guards rows owned by one aggregate; rows that several aggregates may write
    (a snapshot name reused by another sandbox) use `last_seq`, monotonic stream-wide.
    """
    if not rows:
        return
    stmt = insert(table)
    stmt = stmt.on_conflict_do_update(
        index_elements=[table.c[key]],
        set_={c.name: stmt.excluded[c.name] for c in table.columns if c.name != key},
        where=table.c[guard] < stmt.excluded[guard],
    )
    await conn.execute(stmt, list(rows.values()))
