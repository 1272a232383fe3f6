"""Queries on the read models, shaped as E2B wire types. The API reads only from here."""

from __future__ import annotations

import base64
import json
from datetime import datetime
from typing import Any
from urllib.parse import unquote

from sqlalchemy import and_, or_, select
from sqlalchemy.ext.asyncio import AsyncEngine

from api import wire
from api.errors import ApiError
from projections import tables

S = tables.sandboxes
CLIENT_ID = "aenv"


def detail(r: Any) -> wire.SandboxDetail:
    return wire.SandboxDetail(
        template_id=r.template_id,
        sandbox_id=r.sandbox_id,
        client_id=CLIENT_ID,
        started_at=r.started_at or r.requested_at,
        end_at=r.end_at or r.started_at or r.requested_at,
        envd_version=r.envd_version,
        cpu_count=r.cpu_count,
        memory_mb=r.memory_mb,
        disk_size_mb=r.disk_size_mb,
        state=r.state,
        alias=r.alias,
        metadata=dict(r.metadata or {}),
        envd_access_token=r.envd_access_token,
        allow_internet_access=r.allow_internet_access,
        lifecycle=wire.Lifecycle(auto_resume=r.auto_resume, on_timeout=r.on_timeout),
        forked_from=r.forked_from,
        node_id=r.node_id,
    )


def listed(r: Any) -> wire.ListedSandbox:
    d = detail(r)
    return wire.ListedSandbox(**{f: getattr(d, f) for f in wire.ListedSandbox.model_fields})


async def sandbox_row(engine: AsyncEngine, sandbox_id: str, team_id: str) -> Any:
    """The row of a sandbox this team can see, or None."""
    async with engine.connect() as conn:
        return (
            await conn.execute(
                select(S).where(S.c.sandbox_id == sandbox_id, S.c.team_id == team_id)
            )
        ).first()


def parse_metadata_filter(raw: str | None) -> dict[str, str]:
    """E2B's double-encoded `metadata` query value (infra's parseFilters): the framework
    already did the normal query decode; unquote the whole, split, unquote each part."""
    if not raw:
        return {}
    out: dict[str, str] = {}
    for pair in unquote(raw).split("&"):
        if not pair:
            continue
        k, sep, v = pair.partition("=")
        if not sep:
            raise ApiError(400, f"invalid metadata filter {pair!r}: expected key=value")
        out[unquote(k)] = unquote(v)
    return out


def _cursor(r: Any) -> str:
    doc = {"t": (r.started_at or r.requested_at).isoformat(), "id": r.sandbox_id}
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode().rstrip("=")


def _uncursor(token: str) -> tuple[datetime, str]:
    try:
        doc = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        return datetime.fromisoformat(doc["t"]), str(doc["id"])
    except (ValueError, KeyError, TypeError) as e:
        raise ApiError(400, "invalid nextToken") from e


async def list_sandboxes(
    engine: AsyncEngine,
    team_id: str,
    *,
    states: list[str],
    metadata: dict[str, str],
    template: str | None,
    started_after: datetime | None,
    order: str,
    limit: int,
    next_token: str | None,
) -> tuple[list[wire.ListedSandbox], str | None]:
    """One page, ordered by (startedAt, id); the token is the last row's position."""
    started = S.c.started_at
    conds = [S.c.team_id == team_id, S.c.state.in_(states)]
    if metadata:
        conds.append(S.c.metadata.contains(metadata))
    if template:
        conds.append(or_(S.c.template_id == template, S.c.alias == template))
    if started_after:
        conds.append(started > started_after)
    desc = order == "desc"
    if next_token:
        t, sid = _uncursor(next_token)
        if desc:
            conds.append(or_(started < t, and_(started == t, S.c.sandbox_id < sid)))
        else:
            conds.append(or_(started > t, and_(started == t, S.c.sandbox_id > sid)))
    keys = (started.desc(), S.c.sandbox_id.desc()) if desc else (started, S.c.sandbox_id)
    q = select(S).where(*conds).order_by(*keys).limit(limit + 1)
    async with engine.connect() as conn:
        rows = (await conn.execute(q)).all()
    page = rows[:limit]
    token = _cursor(page[-1]) if len(rows) > limit and page else None
    return [listed(r) for r in page], token


async def template_row(engine: AsyncEngine, template: str) -> Any:
    t = tables.templates
    async with engine.connect() as conn:
        return (
            await conn.execute(
                select(t).where(
                    or_(t.c.template_id == template, t.c.alias == template), t.c.deleted.is_(False)
                )
            )
        ).first()


async def snapshot_rows(
    engine: AsyncEngine, team_id: str, sandbox_id: str | None, name: str | None, limit: int
) -> list[Any]:
    t = tables.snapshots
    q = select(t).where(t.c.team_id == team_id, t.c.status == "ready")
    if sandbox_id:
        q = q.where(t.c.sandbox_id == sandbox_id)
    if name:
        q = q.where(t.c.snapshot_id == name)
    async with engine.connect() as conn:
        return list((await conn.execute(q.order_by(t.c.taken_at.desc()).limit(limit))).all())


async def snapshot_node(engine: AsyncEngine, snapshot_id: str) -> str | None:
    """The node holding a snapshot template's capture: the one its source sandbox ran on."""
    t, s = tables.snapshots, tables.sandboxes
    q = select(s.c.node_id).join(t, t.c.sandbox_id == s.c.sandbox_id).where(
        t.c.snapshot_id == snapshot_id, t.c.status == "ready"
    )
    async with engine.connect() as conn:
        node: str | None = (await conn.execute(q)).scalar()
    return node
