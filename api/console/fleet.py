"""The console's fleet, templates and builds fragments: nodes with their room from the
heartbeats, the team's sandboxes by status, its templates and builds; and a build's log,
streamed to the page as the builder writes it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from litestar import Response, get
from litestar.response import Stream

from api.auth import Caller
from api.console import reads
from api.console.render import html
from api.context import ApiContext
from api.errors import ApiError

__all__ = ["ROUTES"]

#: How often a streamed build log looks for new lines in the read model, and how long a
#: stream lasts at most (a build that never ends must not hold a connection for ever: the
#: page opens a new one from where it stopped).
LOG_POLL_S = 0.5
LOG_STREAM_MAX_S = 600.0
_DONE = ("ready", "error")


@get("/console/f/fleet", include_in_schema=False)
async def fleet(ctx: ApiContext, caller: Caller) -> Response[str]:
    await ctx.fenced_to_tail()  # a sandbox the SDK just created is counted
    view = await reads.fleet(ctx, caller.team_id)
    return html("fleet.html", now=datetime.now(UTC), **view)


@get("/console/f/templates", include_in_schema=False)
async def templates(ctx: ApiContext, caller: Caller) -> Response[str]:
    rows, builds = await reads.templates(ctx, caller.team_id)
    return html("templates.html", templates=rows, builds=builds, now=datetime.now(UTC))


async def _build(ctx: ApiContext, caller: Caller, build_id: str) -> dict[str, Any]:
    row = await reads.build(ctx, build_id, caller.team_id)
    if row is None:
        raise ApiError(404, f"build {build_id!r} not found")
    return row


@get("/console/f/builds/{build_id:str}", include_in_schema=False)
async def build(build_id: str, ctx: ApiContext, caller: Caller) -> Response[str]:
    return html("build.html", b=await _build(ctx, caller, build_id), now=datetime.now(UTC))


@get("/console/f/builds/{build_id:str}/log", include_in_schema=False)
async def build_log(build_id: str, ctx: ApiContext, caller: Caller, offset: int = 0) -> Stream:
    """The build's log from entry `offset` as it grows: one JSON object a line
    (`{"idx", "at", "level", "step", "message"}`), then `{"status", "reason"}` once the
    build has ended and every entry was sent."""
    await _build(ctx, caller, build_id)  # the team's, or 404 before anything streams

    async def lines() -> AsyncIterator[bytes]:
        nonlocal offset
        loop = asyncio.get_running_loop()
        give_up = loop.time() + LOG_STREAM_MAX_S
        while loop.time() < give_up:
            row = await reads.build(ctx, build_id, caller.team_id)  # before the lines:
            entries = await reads.build_log(ctx, build_id, max(0, offset))  # none missed
            for e in entries:
                offset = e["idx"] + 1
                yield (
                    json.dumps(
                        {
                            "idx": e["idx"],
                            "at": e["at"].isoformat(),
                            "level": e["level"],
                            "step": e["step"],
                            "message": e["message"],
                        }
                    )
                    + "\n"
                ).encode()
            if row is not None and row["status"] in _DONE and not entries:
                yield (
                    json.dumps({"status": row["status"], "reason": row["reason"]}) + "\n"
                ).encode()
                return
            if not entries:
                await asyncio.sleep(LOG_POLL_S)

    return Stream(
        lines(),
        media_type="application/x-ndjson",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


ROUTES = [fleet, templates, build, build_log]
