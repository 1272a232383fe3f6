"""E2B's template tags (`Template.assign_tags`, `remove_tags`, `get_tags`; the rules are
`domain/tags.py`): a tag names one build of a template, `default` its latest. Changes are
template commands decided by the domain like any other; the captures they leave untagged
are dropped later by the capture sweeper (`api/captures.py`), not here.

Who may change a template's tags: the team that built it (E2B answers 403 for another
team's template; `base` is public and nobody's to retag).
"""

from __future__ import annotations

import contextlib
from datetime import datetime
from typing import Any

from litestar import delete, get, post

from api import ids, reads
from api.auth import Caller
from api.context import ApiContext
from api.errors import COMMON, ApiError, documented
from api.wire_templates import AssignTags, RemoveTags
from bus.decisions import execute
from bus.store import Version
from domain import Event
from domain import build as bd
from domain import tags as tg
from domain import template as tp
from projections import ProjectionTimeout, template_state

__all__ = ["ROUTES", "fenced", "parse_name"]

#: What E2B shows for a build it has no id for (our `base`, and a template's own capture
#: from before its builds were recorded with tags).
NO_BUILD = "00000000-0000-0000-0000-000000000000"


def parse_name(raw: str) -> tuple[str, str | None]:
    """`[team/]name[:tag]` → (name, tag or None), lowercased and checked (else 400). A
    team namespace is the caller's own: it names nothing more."""
    name, sep, tag = raw.strip().lower().partition(":")
    name = name.rsplit("/", 1)[-1]
    if not bd.valid_template_name(name):
        raise ApiError(400, f"invalid template name {raw!r}: use a-z, 0-9, '.', '_', '-'")
    if sep and not tg.valid_tag(tag):
        raise ApiError(400, f"invalid tag {tag!r}: use a-z, 0-9, '.', '_', '-' (not a UUID)")
    return name, tag if sep else None


def _wanted(raw: list[str]) -> tuple[str, ...]:
    wanted = tg.normalize_tags(raw)  # Invalid → 400
    if not wanted:
        raise ApiError(400, "at least one tag is required")
    return wanted


async def fenced(ctx: ApiContext, template_id: str) -> None:
    """Read-your-writes across APIs: the templates read model shows the template's latest
    event (a build another process published, a tag moved there), and this process's
    cached lookups of it are forgotten."""
    seq = (await ctx.bus.templates.version(template_id)).seq
    if seq:
        with contextlib.suppress(ProjectionTimeout):  # far behind: answer from what it has
            await ctx.wait_for_templates(seq)
    ctx.forget(f"tpl:{template_id}")


async def _settled(
    ctx: ApiContext, template_id: str, version: Version, events: list[Event]
) -> None:
    if events:
        with contextlib.suppress(ProjectionTimeout):
            await ctx.wait_for_templates(version.seq)
    ctx.forget(f"tpl:{template_id}")


async def _owned(ctx: ApiContext, caller: Caller, name: str) -> dict[str, Any]:
    """`name`'s row if the caller's team built it: 404 if there is no such template, 403
    if it is another team's (or `base`)."""
    row = await reads.template(ctx.engine, name)
    if row is None or row["template_id"] != name:
        raise ApiError(404, f"template '{name}' not found")
    team, _ = await reads.template_builder(ctx.engine, name)
    if team != caller.team_id:
        raise ApiError(403, f"you don't have access to template '{name}'")
    return row


async def _build_id(ctx: ApiContext, template_id: str, tagged: tg.TaggedBuild | None) -> str:
    """The build a tag names; an untagged template's `default` is its latest ready build."""
    if tagged is not None and tagged.build_id is not None:
        return tagged.build_id
    _, last_ready = await reads.template_builder(ctx.engine, template_id)
    return last_ready or NO_BUILD


@post("/templates/tags", status_code=201, responses=documented(*COMMON, 403))
async def assign_tags(data: AssignTags, ctx: ApiContext, caller: Caller) -> dict[str, Any]:
    """Point `tags` at the build `target` (`name:tag`, `default` if no tag) names now."""
    name, tag = parse_name(data.target)
    wanted = _wanted(data.tags)
    await _owned(ctx, caller, name)
    cmd = tp.AssignTemplateTags(template_id=name, target_tag=tag or tg.DEFAULT_TAG, tags=wanted)
    state, version, events = await execute(ctx.bus.templates, cmd)
    await _settled(ctx, name, version, events)
    assert state is not None
    return {"tags": list(wanted), "buildID": await _build_id(ctx, name, state.tagged(wanted[0]))}


@delete("/templates/tags", status_code=204, responses=documented(*COMMON, 403))
async def remove_tags(data: RemoveTags, ctx: ApiContext, caller: Caller) -> None:
    """Remove tags (not `default`); tags the template does not have are no error."""
    name, tag = parse_name(data.name)
    if tag is not None:
        raise ApiError(400, "the template name must not carry a tag: list tags in 'tags'")
    wanted = _wanted(data.tags)
    await _owned(ctx, caller, name)
    cmd = tp.RemoveTemplateTags(template_id=name, tags=wanted)
    _, version, events = await execute(ctx.bus.templates, cmd)
    await _settled(ctx, name, version, events)


@get("/templates/{template_id:str}/tags", responses=documented(*COMMON, 403))
async def list_tags(template_id: str, ctx: ApiContext, caller: Caller) -> list[dict[str, Any]]:
    """Every tag of a template, `default` included, oldest assignment first."""
    if not ids.is_template_ref(template_id.rsplit("/", 1)[-1]):
        raise ApiError(404, f"template '{template_id}' not found")
    name, _ = parse_name(template_id)
    await fenced(ctx, name)
    row = await reads.template(ctx.engine, name)
    if row is None:
        raise ApiError(404, f"template '{template_id}' not found")
    tid = row["template_id"]
    if tid not in tp.BUILTIN_TEMPLATES:
        team, _ = await reads.template_builder(ctx.engine, tid)
        if team != caller.team_id:
            raise ApiError(403, f"you don't have access to template '{template_id}'")
    created: datetime = row["created_at"]
    tagged = sorted(
        template_state(row).effective_tags().items(), key=lambda kv: (kv[1].at or created, kv[0])
    )
    return [
        {
            "tag": tag,
            "buildID": await _build_id(ctx, tid, b),
            "createdAt": (b.at or created).isoformat(),
        }
        for tag, b in tagged
    ]


ROUTES = [assign_tags, remove_tags, list_tags]
