"""Read-model queries of the template routes: builds, their logs, templates with builds."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from projections import tables

B = tables.builds
L = tables.build_logs
T = tables.templates


async def log_entries(engine: AsyncEngine, build_id: str, offset: int, limit: int) -> list[Any]:
    q = select(L).where(L.c.build_id == build_id, L.c.idx >= offset).order_by(L.c.idx).limit(limit)
    async with engine.connect() as conn:
        return list((await conn.execute(q)).all())


async def builds_of(engine: AsyncEngine, template_id: str) -> list[Any]:
    """A template's builds, newest first."""
    q = select(B).where(B.c.template_id == template_id).order_by(B.c.requested_at.desc())
    async with engine.connect() as conn:
        return list((await conn.execute(q)).all())


async def team_templates(engine: AsyncEngine, team_id: str) -> list[tuple[Any, list[Any]]]:
    """(template row or None, its builds by this team newest first) for `base` and every
    template this team built (the row is None while a first build is still running);
    snapshot templates are listed by the snapshot routes instead."""
    async with engine.connect() as conn:
        builds = (
            await conn.execute(
                select(B).where(B.c.team_id == team_id).order_by(B.c.requested_at.desc())
            )
        ).all()
        by_template: dict[str, list[Any]] = {}
        for b in builds:
            by_template.setdefault(b.template_id, []).append(b)
        ids = sorted(set(by_template) | {"base"})
        rows = {
            r.template_id: r
            for r in await conn.execute(
                select(T).where(T.c.template_id.in_(ids), T.c.deleted.is_(False))
            )
        }
    out: list[tuple[Any, list[Any]]] = []
    for tid in ids:
        row, bs = rows.get(tid), by_template.get(tid, [])
        if row is not None or (bs and bs[0].status in ("waiting", "building")):
            out.append((row, bs))
    return out
