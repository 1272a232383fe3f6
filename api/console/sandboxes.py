"""The console's sandbox fragments: the list (filtered, paged), one sandbox's header (state,
resources, TTL, metadata; polled), and its history (timeline from the log, fork tree;
reloaded when the sandbox changes). Read-only: the page's buttons call the REST routes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from litestar import Response, get
from litestar.params import Parameter

from api.auth import Caller
from api.console import reads
from api.console.render import html
from api.console.timeline import lifeline, steps
from api.console.tree import BOX_H, BOX_W, layout
from api.context import ApiContext
from api.errors import ApiError
from api.guards import not_found
from api.ids import is_sandbox_id
from domain import tags as tg
from projections.console import FAMILY_LIMIT

__all__ = ["ROUTES"]


def _shown(row: dict[str, Any]) -> dict[str, Any]:
    """A read-model row as the templates show it (the template as E2B names it)."""
    return {**row, "template": row["alias"] or tg.shown_template(row["template_id"])}


@get("/console/f/sandboxes", include_in_schema=False)
async def sandbox_list(
    ctx: ApiContext,
    caller: Caller,
    status: str = "live",
    template: str = "",
    metadata: str = "",
    node: str = "",
    page: Annotated[int, Parameter(ge=1, le=100_000)] = 1,
) -> Response[str]:
    await ctx.fenced_to_tail()
    f = reads.Filters(status, template, metadata, node, page)
    rows, total = await reads.sandbox_list(ctx, caller.team_id, f)
    pages = max(1, -(-total // reads.PAGE_SIZE))
    return html(
        "sandbox_list.html",
        rows=[_shown(r) for r in rows],
        total=total,
        f=f,
        pages=pages,
        first=(f.page - 1) * reads.PAGE_SIZE + 1,
        now=datetime.now(UTC),
    )


async def _owned(ctx: ApiContext, caller: Caller, sandbox_id: str) -> dict[str, Any]:
    if not is_sandbox_id(sandbox_id):
        raise not_found(sandbox_id)
    row = await reads.sandbox(ctx, sandbox_id, caller.team_id)
    if row is None:  # another team's is not found, as on every REST route
        raise not_found(sandbox_id)
    return row


@get("/console/f/sandboxes/{sandbox_id:str}", include_in_schema=False)
async def sandbox_header(sandbox_id: str, ctx: ApiContext, caller: Caller) -> Response[str]:
    row = await _owned(ctx, caller, sandbox_id)
    return html("sandbox.html", s=_shown(row), now=datetime.now(UTC))


@get("/console/f/sandboxes/{sandbox_id:str}/history", include_in_schema=False)
async def sandbox_history(sandbox_id: str, ctx: ApiContext, caller: Caller) -> Response[str]:
    row = await _owned(ctx, caller, sandbox_id)
    past = await reads.sandbox_history(ctx, sandbox_id, caller.team_id)
    if not past.lines:
        raise ApiError(404, f"no events for sandbox {sandbox_id}")
    drawing = layout(past.family, sandbox_id, truncated=len(past.family) >= FAMILY_LIMIT)
    return html(
        "history.html",
        s=_shown(row),
        steps=steps(past.lines),
        tree=drawing,
        life=lifeline(past.points, datetime.now(UTC)),
        box_w=BOX_W,
        box_h=BOX_H,
    )


ROUTES = [sandbox_list, sandbox_header, sandbox_history]
