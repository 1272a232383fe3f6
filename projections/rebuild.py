"""Rebuilding a projection from stream sequence 0 into fresh tables, then swapping them in.

The fresh tables live in a scratch schema (`CREATE TABLE … (LIKE live INCLUDING ALL)`), and
the projection writes there through SQLAlchemy's `schema_translate_map`: the very same code
that maintains the live tables. Before swapping, the rebuilt rows can be compared with the
live ones: they must be identical (auditors rely on it, design §1.3).

Swap: one transaction locks the live checkpoint row (so the live projector pauses between
batches), checks the rebuild is at least as far, then TRUNCATE + INSERT … SELECT per table.
TRUNCATE takes ACCESS EXCLUSIVE on the live tables: API reads wait for the swap (a copy of
the read model, ~1 s per 100k rows), which is why rebuilds are operator-initiated.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any

from nats.js import JetStreamContext
from sqlalchemy import Table, select, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from bus import BusSettings
from projections import checkpoints
from projections.base import Projection
from projections.errors import RebuildError
from projections.runner import Projector
from projections.tables import projection_checkpoints

__all__ = ["RebuildReport", "rebuild", "table_rows"]

#: Attempts to find the live projector not ahead of the rebuild at swap time.
_SWAP_ATTEMPTS = 5


@dataclass(frozen=True)
class RebuildReport:
    projection: str
    seq: int
    rows: dict[str, int]
    identical: bool
    differences: dict[str, int]
    swapped: bool
    seconds: float


async def table_rows(conn: AsyncConnection, table: Table) -> list[dict[str, Any]]:
    """Every row of `table`, ordered by primary key (compares two copies of a table)."""
    result = await conn.execute(select(table).order_by(*table.primary_key.columns))
    return [dict(r) for r in result.mappings()]


async def rebuild(
    engine: AsyncEngine,
    js: JetStreamContext,
    bus_settings: BusSettings,
    projection: Projection,
    *,
    swap: bool = True,
) -> RebuildReport:
    """Refold `projection` from sequence 0; compare with the live tables; swap if asked."""
    try:
        return await _rebuild(engine, js, bus_settings, projection, swap)
    except SQLAlchemyError as e:
        raise RebuildError(f"{projection.name}: {e}") from e


async def _rebuild(
    engine: AsyncEngine,
    js: JetStreamContext,
    bus_settings: BusSettings,
    projection: Projection,
    swap: bool,
) -> RebuildReport:
    started = time.monotonic()
    schema = f"rebuild_{projection.name}_{secrets.token_hex(4)}"
    live_tables = [*projection.tables, projection_checkpoints]
    async with engine.begin() as conn:
        await conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        for t in live_tables:
            await conn.execute(
                text(f'CREATE TABLE "{schema}"."{t.name}" (LIKE public."{t.name}" INCLUDING ALL)')
            )
    shadow = engine.execution_options(schema_translate_map={None: schema})
    try:
        projector = Projector(shadow, js, bus_settings, projection)
        seq = await projector.catch_up()
        identical, diffs, counts = await _compare(engine, shadow, projection)
        swapped = False
        if swap:
            seq = await _swap(engine, projector, projection, schema)
            swapped = True
        return RebuildReport(
            projection.name, seq, counts, identical, diffs, swapped, time.monotonic() - started
        )
    finally:
        async with engine.begin() as conn:
            await conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))


async def _compare(
    live: AsyncEngine, shadow: AsyncEngine, projection: Projection
) -> tuple[bool, dict[str, int], dict[str, int]]:
    diffs: dict[str, int] = {}
    counts: dict[str, int] = {}
    async with live.connect() as a, shadow.connect() as b:
        for t in projection.tables:
            old, new = await table_rows(a, t), await table_rows(b, t)
            counts[t.name] = len(new)
            keys = {tuple(r[c.name] for c in t.primary_key.columns): r for r in old}
            changed = sum(
                1
                for r in new
                if keys.pop(tuple(r[c.name] for c in t.primary_key.columns), None) != r
            )
            diffs[t.name] = changed + len(keys)
    return all(v == 0 for v in diffs.values()), diffs, counts


async def _swap(
    engine: AsyncEngine, projector: Projector, projection: Projection, schema: str
) -> int:
    for _ in range(_SWAP_ATTEMPTS):
        async with engine.begin() as conn:
            live = await checkpoints.lock(conn, projection.name)
            if live <= projector.position:
                for t in projection.tables:
                    await conn.execute(text(f'TRUNCATE public."{t.name}"'))
                    await conn.execute(
                        text(f'INSERT INTO public."{t.name}" SELECT * FROM "{schema}"."{t.name}"')
                    )
                await checkpoints.write(conn, projection.name, projector.position)
                return projector.position
        await projector.catch_up()  # the live projector moved on meanwhile: follow it
    raise RebuildError(f"{projection.name}: live projection kept moving ahead of the rebuild")
