"""Projection checkpoints: the last stream sequence each projection has committed."""

from __future__ import annotations

import asyncio
import time

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from projections.errors import ProjectionError, ProjectionTimeout
from projections.tables import projection_checkpoints as cp

__all__ = ["ensure", "lock", "read", "wait_for", "write"]

#: Poll period of `wait_for`: a projection applies a batch in a few ms, so 10 ms keeps a
#: read-your-writes wait short without hammering the database.
_POLL_S = 0.01


async def ensure(conn: AsyncConnection, name: str) -> None:
    await conn.execute(insert(cp).values(name=name, seq=0).on_conflict_do_nothing())


async def lock(conn: AsyncConnection, name: str) -> int:
    """The checkpoint, row-locked until the transaction ends: one writer per projection (a
    second replica, or a rebuild swapping tables in, waits here instead of interleaving)."""
    seq = await conn.scalar(select(cp.c.seq).where(cp.c.name == name).with_for_update())
    return int(seq or 0)


async def write(conn: AsyncConnection, name: str, seq: int) -> None:
    await conn.execute(cp.update().where(cp.c.name == name).values(seq=seq))


async def read(conn: AsyncConnection, name: str) -> int:
    return int(await conn.scalar(select(cp.c.seq).where(cp.c.name == name)) or 0)


async def wait_for(engine: AsyncEngine, name: str, seq: int, timeout: float = 5.0) -> int:
    """Wait until projection `name` has committed stream sequence `seq` (read-your-writes)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            async with engine.connect() as conn:
                current = await read(conn, name)
        except SQLAlchemyError as e:
            raise ProjectionError(f"cannot read the checkpoint of {name}: {e}") from e
        if current >= seq:
            return current
        if time.monotonic() > deadline:
            raise ProjectionTimeout(f"{name} at {current}, not {seq}, after {timeout}s")
        await asyncio.sleep(_POLL_S)
