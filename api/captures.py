"""Template captures on the nodes: who holds one (`holders`), and the sweeper that drops
the captures no tag names any more (`domain/tags.py`).

A tag change records the captures it leaves untagged in the template's `released`; this
drops each once it has been released for `grace_s` — long enough that a create which
resolved the tag just before (this API's lookup cache serves a name for up to 30 s, and a
create may wait for a node a while) still finds its capture — then records the drop. It
reads what is due from the read model, decides on the aggregate (a capture is dropped
once, whichever API of a fleet gets there first: the command ids are derived), and is
idempotent all the way, so a crash anywhere only delays a drop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime, timedelta

from api import reads
from api.context import ApiContext
from bus.decisions import execute
from bus.supervised import supervise
from bus.tasks import cancel_and_wait
from domain import NotFound
from domain import sandbox as sb
from domain import tags as tg
from domain import template as tp

__all__ = ["CaptureSweeper", "drop_capture", "holders"]

log = logging.getLogger(__name__)


async def holders(ctx: ApiContext, template_id: str) -> set[str]:
    """The nodes that may hold a template's capture: the one that took it (or imported it)
    and every node beating — any of them may have taken it over from the repository."""
    node = await reads.snapshot_node(ctx.engine, template_id)
    if node is None:  # a template imported from an image (`aenv pull`) names its node
        history = await ctx.bus.templates.read(template_id)
        imports = [r.event for r in history if isinstance(r.event, tp.TemplateImported)]
        node = imports[-1].node_id if imports else None
    known = set(ctx.nodes.beats) if ctx.nodes is not None else set()
    return known | ({node} if node is not None else set())


async def drop_capture(ctx: ApiContext, template_id: str, capture_id: str) -> bool:
    """Drop one released capture of `template_id`: its template from the log and every
    node, then the record of it. False if there was nothing (left) to drop."""
    state, _ = await ctx.bus.templates.load(template_id)
    if state is None or capture_id not in state.released:
        return False
    delete_id = sb.derived_command_id("capture-delete", capture_id)
    delete = tp.DeleteTemplate(template_id=capture_id, command_id=delete_id)
    if capture_id != template_id:  # a build's capture: a template of its own
        with contextlib.suppress(NotFound):  # deleted already (a sweep cut short)
            await execute(ctx.bus.templates, delete)
        await ctx.bus.commands.to_each_node(await holders(ctx, capture_id), delete)
    elif capture_id not in tg.captures(state.effective_tags()):
        # the template's own capture from before tags: only the nodes drop it (the template
        # lives on) — unless the name has a capture of its own again (a snapshot since)
        await ctx.bus.commands.to_each_node(await holders(ctx, capture_id), delete)
    ctx.forget(f"tpl:{capture_id}")
    ctx.forget(f"tpl-node:{capture_id}")
    done = tp.DropTemplateCapture(
        template_id=template_id,
        capture_id=capture_id,
        command_id=sb.derived_command_id("capture-drop", template_id, capture_id),
    )
    _, _, events = await execute(ctx.bus.templates, done)
    return bool(events)


class CaptureSweeper:
    """Drops released captures `grace_s` after their release, checking every `every_s`."""

    def __init__(self, ctx: ApiContext, *, grace_s: float, every_s: float | None = None) -> None:
        self.ctx = ctx
        self.grace_s = grace_s
        self.every_s = every_s if every_s is not None else min(30.0, max(0.5, grace_s / 4))
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = supervise("capture-sweeper", self._run)

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    async def _run(self) -> None:
        while True:
            try:
                await self.sweep()
            except Exception as e:  # the next round retries: every step is idempotent
                log.warning("capture sweep failed: %s", e)
            await asyncio.sleep(self.every_s)

    async def sweep(self, now: datetime | None = None) -> int:
        """Drop what is due; how many captures were dropped."""
        horizon = (now or datetime.now(UTC)) - timedelta(seconds=self.grace_s)
        dropped = 0
        for template_id, capture_id, since in await reads.released_captures(self.ctx.engine):
            if since <= horizon and await drop_capture(self.ctx, template_id, capture_id):
                log.info(
                    "template %s: dropped capture %s (untagged since %s)",
                    template_id,
                    capture_id,
                    since.isoformat(),
                )
                dropped += 1
        return dropped
