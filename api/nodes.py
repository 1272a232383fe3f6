"""Operators' routes on nodes (not in E2B's API): cordon, uncordon and drain one
(`aenv node …`). Each needs an operator's key (`api.cordons.require_operator`): they act
on every team's sandboxes."""

from __future__ import annotations

from typing import Any

from litestar import post

from api import drain
from api.auth import Caller
from api.context import ApiContext
from api.cordons import require_operator, set_cordon
from api.errors import ERRORS, ApiError, documented

__all__ = ["ROUTES"]

_RESPONSES = {**ERRORS, **documented(403, 504)}


def _view(node_id: str, cordoned: bool, reason: str) -> dict[str, Any]:
    return {"nodeID": node_id, "cordoned": cordoned, "reason": reason}


@post("/nodes/{node_id:str}/cordon", status_code=200, responses=_RESPONSES)
async def cordon_node(ctx: ApiContext, caller: Caller, node_id: str) -> dict[str, Any]:
    """The node takes no new sandboxes (answered once its heartbeat says so)."""
    require_operator(caller)
    node = await set_cordon(ctx, node_id, True, reason="cordon", actor=caller.key_id)
    return _view(node_id, node.cordoned, node.reason)


@post("/nodes/{node_id:str}/uncordon", status_code=200, responses=_RESPONSES)
async def uncordon_node(ctx: ApiContext, caller: Caller, node_id: str) -> dict[str, Any]:
    """The node takes new sandboxes again."""
    require_operator(caller)
    node = await set_cordon(ctx, node_id, False, actor=caller.key_id)
    return _view(node_id, node.cordoned, node.reason)


@post("/nodes/{node_id:str}/drain", status_code=200, responses=_RESPONSES)
async def drain_node(ctx: ApiContext, caller: Caller, node_id: str) -> dict[str, Any]:
    """Cordon the node, pause every sandbox it runs, and say how many of its sandboxes
    are paused and durable (`done` once all are). Repeat it until done: each call pauses
    what runs there by then."""
    require_operator(caller)
    await set_cordon(ctx, node_id, True, reason="drain", actor=caller.key_id)
    progress = await drain.step(ctx, node_id, actor=caller.key_id)
    if progress.running and await ctx.node_gone(node_id):
        raise ApiError(
            503,
            f"node {node_id} is not running: its {progress.running} running sandboxes cannot "
            "be paused (start it again to drain it)",
        )
    return progress.wire()


ROUTES = [cordon_node, uncordon_node, drain_node]
