"""What a projection is: a named fold of one aggregate kind's events into some tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from sqlalchemy import Table
from sqlalchemy.ext.asyncio import AsyncConnection

from bus import AggregateKind, RecordedEvent

__all__ = ["Projection"]


class Projection(Protocol):
    """Applies batches of events inside the runner's transaction.

    `apply` must be deterministic (timestamps from events, never the clock) and monotonic
    (guarded upserts), so that replaying from any checkpoint, or from 0, converges to the
    same rows.
    """

    name: str
    kind: AggregateKind
    tables: tuple[Table, ...]

    async def apply(self, conn: AsyncConnection, batch: Sequence[RecordedEvent]) -> None: ...
