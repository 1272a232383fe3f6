"""Where a create from a template must go while its capture is only on one node's disk
(not uploaded yet), and placement once it is in the snapshot repository (S6: every node
fetches what it lacks)."""

from __future__ import annotations

from typing import Any

from api import reads
from api.context import ApiContext
from api.resume import node_or_placement

__all__ = ["template_node"]


async def template_node(ctx: ApiContext, tpl: dict[str, Any]) -> str | None:
    """Where a create from `tpl` goes: a durable template (its capture uploaded) to
    placement, whose nodes fetch what they lack (`held_on`: those holding it first); a
    snapshot whose capture is only on its node's disk to that node (`node_or_placement`)."""
    if tpl.get("capture_key"):
        return None
    tpl_id = tpl["template_id"]
    node: str | None = await ctx.cached(f"tpl-node:{tpl_id}", lambda: _holder(ctx, tpl_id))
    return await node_or_placement(
        ctx,
        node,
        durable=False,
        stranded=f"template {tpl_id!r} is on node {node}, which is not running, and its "
        "capture has not reached the snapshot repository",
    )


async def _holder(ctx: ApiContext, tpl_id: str) -> str | None:
    """The node holding a capture not uploaded yet: a snapshot's (the read model), else an
    imported image's (the log: a create right after its import — an image-first create's
    own — must go where the capture is, not to a node that has neither it nor a copy in
    the repository)."""
    node = await reads.snapshot_node(ctx.engine, tpl_id)
    if node is None:
        state, _ = await ctx.bus.templates.load(tpl_id)
        node = state.imported_on if state is not None else None
    return node
