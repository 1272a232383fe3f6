"""The read queries the API needs, over the read models only (never the event stream).

Each takes a connection, so the caller chooses the transaction (and may `wait_for` a
sequence first for read-your-writes).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, and_, func, or_, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from domain import sandbox as sb
from projections.tables import (
    api_keys,
    build_logs,
    builds,
    projection_checkpoints,
    sandboxes,
    snapshots,
    template_spawns,
    templates,
    volumes,
)

__all__ = [
    "InvalidToken",
    "Page",
    "api_key_by_hash",
    "build_log_entries",
    "get_sandbox",
    "list_sandboxes",
    "list_snapshots",
    "node_sandbox_ids",
    "released_captures",
    "sandbox_census",
    "snapshot_node",
    "team_templates",
    "team_volumes",
    "template_builder",
    "template_by_id_or_alias",
]

Row = dict[str, Any]
#: E2B's list limit: 1..100, default 100.
MAX_PAGE = 100


@dataclass(frozen=True)
class Page:
    """One page of a listing; `next_token` None on the last page (E2B's `X-Next-Token`)."""

    rows: list[Row]
    next_token: str | None


async def get_sandbox(conn: AsyncConnection, sandbox_id: str, team_id: str | None) -> Row | None:
    """A sandbox E2B would show (running or paused) that belongs to `team_id`, else None."""
    q = select(sandboxes).where(
        sandboxes.c.sandbox_id == sandbox_id, sandboxes.c.state.is_not(None)
    )
    if team_id is not None:
        q = q.where(sandboxes.c.team_id == team_id)
    row = (await conn.execute(q)).mappings().first()
    return dict(row) if row else None


def _token(started_at: datetime, sandbox_id: str) -> str:
    raw = json.dumps([started_at.isoformat(), sandbox_id]).encode()
    return base64.urlsafe_b64encode(raw).decode()


class InvalidToken(ValueError):
    """A `nextToken` this module did not issue (the API answers 400)."""


def _untoken(token: str) -> tuple[datetime, str]:
    try:
        started, sid = json.loads(base64.urlsafe_b64decode(token.encode()))
        return datetime.fromisoformat(started), str(sid)
    except (ValueError, TypeError) as e:  # bad base64, JSON, shape or timestamp
        raise InvalidToken(f"invalid nextToken {token[:40]!r}") from e


async def list_sandboxes(
    conn: AsyncConnection,
    team_id: str | None,
    *,
    states: Sequence[str] = ("running", "paused"),
    metadata: dict[str, str] | None = None,
    template: str | None = None,
    node: str | None = None,
    started_after: datetime | None = None,
    descending: bool = True,
    limit: int = MAX_PAGE,
    next_token: str | None = None,
) -> Page:
    """E2B's `GET /v2/sandboxes`: keyset pagination on (started_at, sandbox_id)."""
    limit = max(1, min(limit, MAX_PAGE))
    c = sandboxes.c
    q: Select[Any] = select(sandboxes).where(c.state.in_(list(states)), c.started_at.is_not(None))
    if team_id is not None:
        q = q.where(c.team_id == team_id)
    if metadata:
        q = q.where(c.metadata.contains(metadata))  # JSONB @>, served by the GIN index
    if template:
        q = q.where(or_(c.template_id == template, c.alias == template))
    if node:
        q = q.where(c.node_id == node)
    if started_after is not None:
        q = q.where(c.started_at >= started_after)  # E2B: inclusive
    if next_token:
        at, sid = _untoken(next_token)
        if descending:
            q = q.where(or_(c.started_at < at, and_(c.started_at == at, c.sandbox_id < sid)))
        else:
            q = q.where(or_(c.started_at > at, and_(c.started_at == at, c.sandbox_id > sid)))
    order = (
        (c.started_at.desc(), c.sandbox_id.desc())
        if descending
        else (c.started_at.asc(), c.sandbox_id.asc())
    )
    rows = [dict(r) for r in (await conn.execute(q.order_by(*order).limit(limit + 1))).mappings()]
    more = len(rows) > limit
    rows = rows[:limit]
    token = _token(rows[-1]["started_at"], rows[-1]["sandbox_id"]) if more and rows else None
    return Page(rows, token)


async def node_sandbox_ids(conn: AsyncConnection, node_id: str) -> list[str]:
    """Every sandbox on a node that is not killed or failed, of every team (a drain's)."""
    c = sandboxes.c
    q = select(c.sandbox_id).where(c.node_id == node_id, c.status.not_in(["killed", "failed"]))
    return [str(r) for r in (await conn.execute(q.order_by(c.sandbox_id))).scalars()]


async def list_snapshots(
    conn: AsyncConnection,
    team_id: str | None,
    sandbox_id: str | None = None,
    *,
    name: str | None = None,
    limit: int | None = None,
    newest_first: bool = False,
) -> list[Row]:
    """Ready snapshots (persistent ones: each is also a template named by its id) whose
    template has not been deleted: the snapshot row stays (the sandbox's history says it
    was taken), `DELETE /templates/{id}` marks only the template."""
    c = snapshots.c
    deleted = select(templates.c.template_id).where(
        templates.c.template_id == c.snapshot_id, templates.c.deleted.is_(True)
    )
    q = select(snapshots).where(c.status == "ready", ~deleted.exists())
    if team_id is not None:
        q = q.where(c.team_id == team_id)
    if sandbox_id is not None:
        q = q.where(c.sandbox_id == sandbox_id)
    if name is not None:
        q = q.where(c.snapshot_id == name)
    q = q.order_by(c.taken_at.desc() if newest_first else c.taken_at)
    if limit is not None:
        q = q.limit(limit)
    return [dict(r) for r in (await conn.execute(q)).mappings()]


async def snapshot_node(conn: AsyncConnection, snapshot_id: str) -> str | None:
    """The node holding a snapshot template's capture: the one that took it (for snapshots
    from before that was recorded, the node its source sandbox is on). None also tells a
    snapshot template apart from a built one."""
    s = sandboxes.c
    q = (
        select(func.coalesce(snapshots.c.node_id, s.node_id))
        .join(snapshots, snapshots.c.sandbox_id == s.sandbox_id)
        .where(snapshots.c.snapshot_id == snapshot_id, snapshots.c.status == "ready")
    )
    node: str | None = (await conn.execute(q)).scalar()
    return node


async def template_by_id_or_alias(conn: AsyncConnection, ref: str) -> Row | None:
    """The live template whose id or alias is `ref` (id wins)."""
    q = (
        select(templates)
        .where(
            or_(templates.c.template_id == ref, templates.c.alias == ref),
            templates.c.deleted.is_(False),
        )
        .order_by((templates.c.template_id == ref).desc())
    )
    row = (await conn.execute(q)).mappings().first()
    return dict(row) if row else None


async def api_key_by_hash(conn: AsyncConnection, key_sha256: str) -> Row | None:
    """The unrevoked key with this hash (the API hashes what `X-API-KEY` carries)."""
    q = select(api_keys).where(api_keys.c.key_sha256 == key_sha256, api_keys.c.revoked_at.is_(None))
    row = (await conn.execute(q)).mappings().first()
    return dict(row) if row else None


async def timer_start(conn: AsyncConnection, projection: str) -> tuple[list[sb.Clock], int]:
    """Where a TTL timer starts: the clock of every sandbox not killed, and the
    stream sequence the sandboxes projection had folded when they were read — the timer
    follows the log from the next one. Both from one snapshot of the database (call it on
    a REPEATABLE READ connection: the projector commits rows and checkpoint together)."""
    seq = await conn.scalar(
        select(projection_checkpoints.c.seq).where(projection_checkpoints.c.name == projection)
    )
    s = sandboxes.c
    # (a sandbox paused before 0008 recorded when: since its row last changed)
    paused_at = func.coalesce(s.paused_at, s.updated_at).label("paused_at")
    q = select(
        s.sandbox_id, s.status, s.node_id, s.end_at, s.on_timeout, s.pause_memory, paused_at
    ).where(s.status != sb.SandboxStatus.KILLED.value)
    clocks = [
        sb.Clock(
            sandbox_id=r.sandbox_id,
            status=sb.SandboxStatus(r.status),
            node_id=r.node_id,
            end_at=r.end_at,
            on_timeout=r.on_timeout,
            pause_memory=r.pause_memory,
            paused_at=r.paused_at if r.status == sb.SandboxStatus.PAUSED.value else None,
        )
        for r in await conn.execute(q)
    ]
    return clocks, int(seq or 0)


async def build_log_entries(
    conn: AsyncConnection, build_id: str, offset: int, limit: int
) -> list[Row]:
    """A build's log lines from position `offset` (E2B's `logsOffset`), oldest first."""
    q = (
        select(build_logs)
        .where(build_logs.c.build_id == build_id, build_logs.c.idx >= offset)
        .order_by(build_logs.c.idx)
        .limit(limit)
    )
    return [dict(r) for r in (await conn.execute(q)).mappings()]


async def team_templates(conn: AsyncConnection, team_id: str) -> list[tuple[Row | None, list[Row]]]:
    """(template row or None, the team's builds of it newest first) for `base` and every
    template the team built; the row is None while a first build is still running or after
    it failed (listed with its reason: the user must see it). Deleted templates are gone,
    and so are the builds discarded by the delete of a template none of them published.
    Snapshot templates are listed by the snapshot routes instead. A row carries its creates
    (`spawn_count`, `last_spawned_at`) once a sandbox was created from the template."""
    q = (
        select(builds)
        .where(builds.c.team_id == team_id, builds.c.discarded.is_(False))
        .order_by(builds.c.requested_at.desc())
    )
    by_template: dict[str, list[Row]] = {}
    for b in (await conn.execute(q)).mappings():
        by_template.setdefault(b["template_id"], []).append(dict(b))
    ids = sorted(set(by_template) | {"base"})
    known = select(templates).where(templates.c.template_id.in_(ids))
    rows = {r["template_id"]: dict(r) for r in (await conn.execute(known)).mappings()}
    spawned = select(template_spawns).where(template_spawns.c.template_id.in_(ids))
    for s in (await conn.execute(spawned)).mappings():
        if s["template_id"] in rows:
            rows[s["template_id"]] |= {
                "spawn_count": s["spawn_count"],
                "last_spawned_at": s["last_spawned_at"],
            }
    out: list[tuple[Row | None, list[Row]]] = []
    for tid in ids:
        row, bs = rows.get(tid), by_template.get(tid, [])
        if row is not None and row["deleted"]:
            continue
        if row is not None or bs:
            out.append((row, bs))
    return out


async def template_builder(
    conn: AsyncConnection, template_id: str
) -> tuple[str | None, str | None]:
    """(the team of the template's latest build, that team's latest ready build of it):
    who may change its tags, and the build an untagged template's `default` is (its log
    predates tags, so only the builds read model knows). (None, None): never built."""
    q = (
        select(builds.c.team_id, builds.c.build_id, builds.c.status)
        .where(builds.c.template_id == template_id)
        .order_by(builds.c.requested_at.desc())
    )
    team: str | None = None
    for b in (await conn.execute(q)).mappings():
        team = team if team is not None else b["team_id"]
        if b["team_id"] == team and b["status"] == "ready":
            return team, b["build_id"]
    return team, None


async def released_captures(conn: AsyncConnection) -> list[tuple[str, str, datetime]]:
    """(template, capture, released since) of every capture no tag names any more and not
    yet dropped, oldest first (the API's capture sweeper drops them after a grace)."""
    q = select(templates.c.template_id, templates.c.released).where(
        templates.c.released != text("'{}'::jsonb")
    )
    out = [
        (r["template_id"], capture, datetime.fromisoformat(since))
        for r in (await conn.execute(q)).mappings()
        for capture, since in r["released"].items()
    ]
    return sorted(out, key=lambda x: (x[2], x[0], x[1]))


async def sandbox_census(conn: AsyncConnection) -> list[tuple[str, str, int]]:
    """(status, node, count) of the sandboxes not killed or failed — the `aenv_sandboxes`
    gauge. One grouped scan of the not-killed rows (the partial index 0007), read at each
    scrape; the node of a sandbox no node took yet is ''."""
    rows = await conn.execute(
        select(sandboxes.c.status, func.coalesce(sandboxes.c.node_id, ""), func.count())
        .where(
            sandboxes.c.status.notin_(
                (sb.SandboxStatus.KILLED.value, sb.SandboxStatus.FAILED.value)
            )
        )
        .group_by(sandboxes.c.status, sandboxes.c.node_id)
    )
    return [(str(status), str(node), int(n)) for status, node, n in rows]


async def team_volumes(conn: AsyncConnection, team_id: str) -> list[Row]:
    """A team's volumes that exist (not destroyed), by name."""
    q = (
        select(volumes)
        .where(volumes.c.team_id == team_id, volumes.c.status != "destroyed")
        .order_by(volumes.c.name)
    )
    return [dict(r) for r in (await conn.execute(q)).mappings()]
