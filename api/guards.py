"""What every sandbox route checks before it acts."""

from __future__ import annotations

from api.auth import Caller
from api.context import ApiContext
from api.errors import ApiError
from api.ids import is_sandbox_id
from domain import sandbox as sb

__all__ = ["node_answers", "not_found", "visible"]


def not_found(sandbox_id: str) -> ApiError:
    return ApiError(404, f'sandbox "{sandbox_id}" not found')


async def visible(ctx: ApiContext, caller: Caller, sandbox_id: str) -> sb.Sandbox:
    """The write-side state of a sandbox this caller owns and E2B would show."""
    if not is_sandbox_id(sandbox_id):  # no subject could hold it: nothing to load
        raise not_found(sandbox_id)
    state, _ = await ctx.bus.sandboxes.load(sandbox_id)
    if state is None or state.team_id != caller.team_id or sb.public_state(state.status) is None:
        raise not_found(sandbox_id)
    return state


async def node_answers(ctx: ApiContext, state: sb.Sandbox, what: str) -> None:
    """A command for a running sandbox goes to its node's queue: a node that stopped
    beating would leave the caller waiting for the command timeout. Say so at once."""
    if state.node_id is not None and await ctx.node_gone(state.node_id):
        raise ApiError(
            503,
            f"cannot {what} sandbox {state.sandbox_id}: its node "
            f"{state.node_id} is not running (its VM went with it)",
        )
