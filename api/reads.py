"""The API's reads: `projections.queries` (the only SQL over the read models) shaped as E2B
wire types, plus E2B's query-string quirks. Handlers read only through here."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import unquote

from sqlalchemy.ext.asyncio import AsyncEngine

from api import wire
from api.errors import ApiError
from domain import sandbox as sb
from domain import tags as tg
from projections import queries, template_state

CLIENT_ID = "aenv"

Row = dict[str, Any]


def detail(r: Row) -> wire.SandboxDetail:
    return wire.SandboxDetail(
        template_id=tg.shown_template(r["template_id"], r["alias"]),
        sandbox_id=r["sandbox_id"],
        client_id=CLIENT_ID,
        started_at=r["started_at"] or r["requested_at"],
        end_at=r["end_at"] or r["started_at"] or r["requested_at"],
        envd_version=r["envd_version"],
        cpu_count=r["cpu_count"],
        memory_mb=r["memory_mb"],
        disk_size_mb=r["disk_size_mb"],
        state=r["state"],
        alias=r["alias"],
        metadata=dict(r["metadata"] or {}),
        **_paused(r),
        envd_access_token=r["envd_access_token"],
        traffic_access_token=r["traffic_access_token"],
        allow_internet_access=r["allow_internet_access"],
        network=_network(r["network"]),
        lifecycle=wire.Lifecycle(auto_resume=r["auto_resume"], on_timeout=r["on_timeout"]),
        forked_from=r["forked_from"],
        node_id=r["node_id"],
        volume_mounts=_mounts(r),
        disk_full_at=r.get("disk_full_at"),
    )


def _paused(r: Row) -> dict[str, Any]:
    """A paused sandbox's pause time and the TTL its resume gives it (`ListedSandbox`)."""
    if r["state"] != "paused" or r["status"] == sb.SandboxStatus.PAUSING:
        return {}  # running, or its pause not done: what it keeps is not decided yet
    ttl = sb.ttl_on_resume(r["remaining_s"], r["timeout_s"])
    return {"paused_at": r["paused_at"], "remaining_s": max(1, round(ttl))}


def _mounts(r: Row) -> list[wire.MountedVolume]:
    return [
        wire.MountedVolume(name=m["name"], path=m["path"]) for m in r.get("volume_mounts") or ()
    ]


def _network(raw: dict[str, Any] | None) -> wire.SandboxNetwork | None:
    """The detail's `network`, from the policy the read model keeps (`sb.NetworkPolicy`)."""
    if not raw:
        return None
    return wire.SandboxNetwork(
        allow_public_traffic=raw.get("allow_public_traffic", True),
        allow_out=list(raw.get("allow_out") or ()),
        deny_out=list(raw.get("deny_out") or ()),
    )


def listed(r: Row) -> wire.ListedSandbox:
    d = detail(r)
    return wire.ListedSandbox(**{f: getattr(d, f) for f in wire.ListedSandbox.model_fields})


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


async def sandbox(engine: AsyncEngine, sandbox_id: str, team_id: str) -> Row | None:
    """A sandbox this team can see in E2B's terms (running or paused), or None."""
    async with engine.connect() as conn:
        return await queries.get_sandbox(conn, sandbox_id, team_id)


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
    node: str | None = None,
) -> tuple[list[wire.ListedSandbox], str | None]:
    try:
        async with engine.connect() as conn:
            page = await queries.list_sandboxes(
                conn,
                team_id,
                states=states,
                metadata=metadata,
                template=template,
                node=node,
                started_after=started_after,
                descending=order == "desc",
                limit=limit,
                next_token=next_token,
            )
    except queries.InvalidToken as e:
        raise ApiError(400, "invalid nextToken") from e
    return [listed(r) for r in page.rows], page.next_token


async def template(engine: AsyncEngine, ref: str) -> Row | None:
    """A live template by id or alias."""
    async with engine.connect() as conn:
        return await queries.template_by_id_or_alias(conn, ref)


async def template_for(engine: AsyncEngine, ref: str) -> Row | None:
    """What a create of `ref` (`name`, `name:tag`, a snapshot's id) restores: the row of
    the capture its tag names, under the alias of the template it was asked by — for a
    built template, its build's capture (`domain/tags.py`); for any other, itself. None:
    no such template, or no such tag."""
    async with engine.connect() as conn:
        for template_id, tag in tg.candidates(ref):
            row = await queries.template_by_id_or_alias(conn, template_id)
            if row is None:
                continue
            capture = template_state(row).capture_for(tag)
            if capture is None or capture == row["template_id"]:
                return row if capture is not None else None
            found = await queries.template_by_id_or_alias(conn, capture)
            return {**found, "alias": row["alias"] or row["template_id"]} if found else None
    return None


async def snapshots(
    engine: AsyncEngine, team_id: str, sandbox_id: str | None, name: str | None, limit: int
) -> list[Row]:
    async with engine.connect() as conn:
        return await queries.list_snapshots(
            conn, team_id, sandbox_id, name=name, limit=limit, newest_first=True
        )


async def snapshot_node(engine: AsyncEngine, snapshot_id: str) -> str | None:
    async with engine.connect() as conn:
        return await queries.snapshot_node(conn, snapshot_id)


async def template_builder(engine: AsyncEngine, template_id: str) -> tuple[str | None, str | None]:
    """(the team that built the template last, its latest ready build), from the builds."""
    async with engine.connect() as conn:
        return await queries.template_builder(conn, template_id)


async def released_captures(engine: AsyncEngine) -> list[tuple[str, str, datetime]]:
    async with engine.connect() as conn:
        return await queries.released_captures(conn)
