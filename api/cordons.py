"""A node's cordon as the API applies it: an operator's `CordonNode`/`UncordonNode` decided
and appended here (no node has work to do for it: `domain/node`), then answered once the
node says in its heartbeat that it heard — so that when `aenv node cordon` returns, the
node has stopped pulling creates and a create sent next lands elsewhere.

Placement reads the cordon two ways: from the heartbeats (`bus.nodes.takes_new`: the fast
503, `warm_on`/`held_on` hints, a volume's preferred node) and from the log itself for a
resume (`cordoned`): a paused sandbox whose capture is durable resumes on another node.
"""

from __future__ import annotations

import asyncio
import re
import time

from api.auth import Caller
from api.context import ApiContext
from api.errors import ApiError
from bus import MessageContext
from bus.decisions import execute
from bus.nodes import is_gone
from domain import node as nd

__all__ = ["HEARD_TIMEOUT_S", "OPERATOR_TEAM", "cordoned", "require_operator", "set_cordon"]

#: The team whose keys are operators' (`aenv up`'s key and `AENV_API_KEY` are in it; keys an
#: operator mints for tenants with `aenv keys create --team X` are not): only they cordon
#: and drain nodes, which acts on every team's sandboxes.
OPERATOR_TEAM = "default"
#: How long a cordon waits for the node's heartbeat to show it: the node looks at its
#: cordon every second (`workers.node.cordon.POLL_S`) and beats at once when it changes.
HEARD_TIMEOUT_S = 10.0


def require_operator(caller: Caller) -> None:
    if caller.team_id != OPERATOR_TEAM:
        raise ApiError(403, "only an operator's key (team default) may cordon or drain nodes")


async def cordoned(ctx: ApiContext, node_id: str) -> bool:
    """Whether an operator cordoned `node_id`, from the log (one round trip while nothing
    changed: the store keeps its fold)."""
    state, _ = await ctx.bus.node_orders.load(node_id)
    return nd.is_cordoned(state)


#: what a node id is (`AENV_NODE_ID`: workers/node/settings.py holds the same pattern)
_NODE_ID = re.compile(r"[a-z0-9-]{1,32}")


async def set_cordon(
    ctx: ApiContext, node_id: str, cordon: bool, *, reason: str = "", actor: str | None
) -> nd.Node:
    """Cordon (or uncordon) `node_id` and return once its heartbeat shows it — at once for
    a node that does not beat (it reads its cordon before it pulls anything when it
    starts). A node that beats but does not say so in time: 504, the cordon stands."""
    if not _NODE_ID.fullmatch(node_id):  # (what a subject and a KV key may hold, too)
        raise ApiError(400, f"invalid node id {node_id!r}: node ids are [a-z0-9-]{{1,32}}")
    cmd: nd.AnyNodeCommand = (
        nd.CordonNode(node_id=node_id, reason=reason)
        if cordon
        else nd.UncordonNode(node_id=node_id)
    )
    decided = await execute(ctx.bus.node_orders, cmd, MessageContext(actor=actor))
    await _heard(ctx, node_id, cordon)
    return decided.state or nd.Node(node_id=node_id)


async def _heard(ctx: ApiContext, node_id: str, cordon: bool) -> None:
    book = await ctx.node_book()
    deadline = time.monotonic() + HEARD_TIMEOUT_S
    while True:
        beat = await book.heartbeat(node_id)
        if is_gone(beat, time.time()) or (beat is not None and beat.cordoned == cordon):
            return
        if time.monotonic() > deadline:
            what = "cordon" if cordon else "uncordon"
            raise ApiError(
                504,
                f"node {node_id} has not confirmed its {what} within {HEARD_TIMEOUT_S:.0f} s "
                "(it is recorded, and the node applies it when it next reads it)",
            )
        await asyncio.sleep(0.1)
