"""E2B's per-sandbox metrics and logs (`Sandbox.get_metrics()`, `e2b sandbox metrics|logs`):
what the node that holds a sandbox observed of its guest (`workers/node/observe.py`),
asked of that node's proxy (its address comes in its heartbeat). A node that is gone, or
does not answer, has nothing to say: an empty answer, not an error — the sandbox's
history is the log's, this is only its recent telemetry."""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from datetime import UTC, datetime
from typing import Annotated, Any

import httpx
from litestar import get
from litestar.params import Parameter

from api.auth import Caller
from api.context import ApiContext
from api.errors import ERRORS
from api.guards import not_found, visible
from api.ids import is_sandbox_id
from domain import sandbox as sb

__all__ = ["ROUTES"]

log = logging.getLogger(__name__)

#: How long the API waits for a node's answer.
ASK_TIMEOUT_S = 3.0
#: E2B's log levels; anything else a guest wrote counts as info.
_LEVELS = ("debug", "info", "warn", "error")


async def _ask(
    ctx: ApiContext, node_id: str | None, path: str, params: dict[str, str] | None = None
) -> Any:
    """The node's answer to `path` on its proxy, or None."""
    beat = await ctx.nodes.heartbeat(node_id) if ctx.nodes and node_id else None
    if beat is None or not beat.proxy:
        return None
    try:
        async with httpx.AsyncClient(timeout=ASK_TIMEOUT_S) as client:
            r = await client.get(f"http://{beat.proxy}{path}", params=params)
    except httpx.HTTPError as e:
        log.info("node %s did not answer %s: %s", node_id, path, e)
        return None
    return r.json() if r.status_code == 200 else None


@get("/sandboxes/{sandbox_id:str}/metrics", responses=ERRORS)
async def sandbox_metrics(
    sandbox_id: str,
    ctx: ApiContext,
    caller: Caller,
    start: int | None = None,
    end: int | None = None,
) -> list[dict[str, Any]]:
    """The sandbox's resource samples (every few seconds while it runs) between unix
    times `start` and `end`."""
    state = await visible(ctx, caller, sandbox_id)
    params = {k: str(v) for k, v in (("start", start), ("end", end)) if v is not None}
    got = await _ask(ctx, state.node_id, f"/sandboxes/{sandbox_id}/metrics", params)
    return got if isinstance(got, list) else []


#: The ids a metrics query may list (about 190 sandboxes). A URL of more than 64 KiB is
#: refused by the HTTP layer itself, in plain text, before the app sees it; a character
#: of the query may take 12 bytes (4 UTF-8 bytes, percent-encoded), so this bound keeps
#: every refusal a JSON 400 of the app's.
MAX_IDS_QUERY = 4000


@get("/sandboxes/metrics", responses=ERRORS)
async def sandboxes_metrics(
    ctx: ApiContext,
    caller: Caller,
    sandbox_ids: Annotated[str, Parameter(query="sandbox_ids", max_length=MAX_IDS_QUERY)] = "",
) -> dict[str, Any]:
    """The latest sample of each of these sandboxes (the caller's; others are left out)."""
    by_node: dict[str | None, list[str]] = defaultdict(list)
    for sid in dict.fromkeys(i for i in sandbox_ids.split(",") if i):
        if not is_sandbox_id(sid):
            continue
        state, _ = await ctx.bus.sandboxes.load(sid)
        if (
            state is not None
            and state.team_id == caller.team_id
            and (sb.public_state(state.status) is not None)
        ):
            by_node[state.node_id].append(sid)
    out: dict[str, Any] = {}
    for node_id, ids in by_node.items():
        got = await _ask(ctx, node_id, "/sandboxes/metrics", {"ids": ",".join(ids)})
        if isinstance(got, dict) and isinstance(got.get("sandboxes"), dict):
            out.update({k: v for k, v in got["sandboxes"].items() if k in ids})
    return {"sandboxes": out}


async def _entries(ctx: ApiContext, caller: Caller, sandbox_id: str) -> list[dict[str, Any]]:
    if not is_sandbox_id(sandbox_id):
        raise not_found(sandbox_id)
    state = await visible(ctx, caller, sandbox_id)
    got = await _ask(ctx, state.node_id, f"/sandboxes/{sandbox_id}/logs")
    entries = got if isinstance(got, list) else []
    for e in entries:
        if e.get("level") not in _LEVELS:
            e["level"] = "info"
    return entries


def _ms(entry: dict[str, Any]) -> int:
    try:
        at = datetime.fromisoformat(str(entry["timestamp"]).replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return 0
    return int(at.astimezone(UTC).timestamp() * 1000)


@get("/sandboxes/{sandbox_id:str}/logs", responses=ERRORS)
async def sandbox_logs(
    sandbox_id: str,
    ctx: ApiContext,
    caller: Caller,
    start: int | None = None,
    limit: Annotated[int, Parameter(ge=1, le=10_000)] = 1000,
) -> dict[str, Any]:
    """E2B's v1 logs: lines from unix milliseconds `start` on, at most `limit`."""
    entries = [
        e for e in await _entries(ctx, caller, sandbox_id) if start is None or _ms(e) >= start
    ][:limit]
    return {
        "logs": [{"timestamp": e["timestamp"], "line": _line(e)} for e in entries],
        "logEntries": entries,
    }


def _line(entry: dict[str, Any]) -> str:
    """A v1 `line` is one JSON log record, as E2B's envd writes them: its CLI parses each
    (`level` and `logger` read, the rest printed as fields)."""
    fields = entry.get("fields") or {}
    return json.dumps(
        {
            **fields,
            "level": entry.get("level", "info"),
            "logger": "envd",
            "message": entry.get("message", ""),
        },
        default=str,
    )


@get("/v2/sandboxes/{sandbox_id:str}/logs", responses=ERRORS)
async def sandbox_logs_v2(
    sandbox_id: str,
    ctx: ApiContext,
    caller: Caller,
    cursor: int | None = None,
    limit: Annotated[int, Parameter(ge=1, le=10_000)] = 1000,
    direction: Annotated[str, Parameter(pattern="^(forward|backward)$")] = "forward",
    level: Annotated[str | None, Parameter(pattern="^(debug|info|warn|error)$")] = None,
    search: Annotated[str | None, Parameter(max_length=1000)] = None,
) -> dict[str, Any]:
    """E2B's v2 logs: from the cursor (unix milliseconds) forward or backward, at least
    `level`, containing `search`."""
    floor = _LEVELS.index(level) if level else 0
    entries = [
        e
        for e in await _entries(ctx, caller, sandbox_id)
        if _LEVELS.index(e["level"]) >= floor and (search is None or search in e.get("message", ""))
    ]
    if direction == "backward":
        entries = [e for e in reversed(entries) if cursor is None or _ms(e) <= cursor]
    else:
        entries = [e for e in entries if cursor is None or _ms(e) >= cursor]
    return {"logs": entries[:limit]}


ROUTES = [sandboxes_metrics, sandbox_metrics, sandbox_logs, sandbox_logs_v2]
