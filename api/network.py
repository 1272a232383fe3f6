"""E2B's `PUT /sandboxes/{id}/network` (`Sandbox.update_network`): replace a running
sandbox's egress rules at once.

The rules are checked here (400 before the sandbox is looked up, as E2B's handler does),
the sandbox's state next (404 unknown, 409 not running), then its node swaps the VM's
firewall and records `SandboxNetworkUpdated` (`workers/node/network.py`); the 204 comes
once the log holds it, so a `GET /sandboxes/{id}` after it shows the new rules.
"""

from __future__ import annotations

from litestar import put

from api import wire
from api.auth import Caller
from api.context import ApiContext
from api.errors import ERRORS
from api.guards import node_answers, visible
from api.outcomes import send_and_wait
from domain import sandbox as sb

__all__ = ["ROUTES", "network_command"]


def network_command(sandbox_id: str, data: wire.NetworkUpdate) -> sb.UpdateSandboxNetwork:
    """The command a body asks for: every field it leaves out cleared (E2B's rule),
    `allow_internet_access` to its default, true. `Invalid` (400) for a bad entry."""
    sb.check_egress(data.allow_out, data.deny_out)
    return sb.UpdateSandboxNetwork(
        sandbox_id=sandbox_id,
        allow_internet_access=(
            True if data.allow_internet_access is None else data.allow_internet_access
        ),
        allow_out=tuple(data.allow_out),
        deny_out=tuple(data.deny_out),
    )


@put("/sandboxes/{sandbox_id:str}/network", status_code=204, responses=ERRORS)
async def update_network(
    sandbox_id: str, data: wire.NetworkUpdate, ctx: ApiContext, caller: Caller
) -> None:
    """204 once the sandbox lives under the new rules. A paused sandbox is a 409: E2B's
    orchestrator refuses one that is not running (409; its paused ones are not in its
    store at all, a 404 that the SDK would report as "not found" — aenv's exists)."""
    sb.check_egress(data.allow_out, data.deny_out)  # 400 before the sandbox is looked up
    state = await visible(ctx, caller, sandbox_id)  # 404 too for an id no sandbox can have
    cmd = network_command(sandbox_id, data)
    sb.decide(state, cmd)  # paused, pausing, …: 409 before any work
    await node_answers(ctx, state, "update the network of")
    await send_and_wait(
        ctx.bus,
        cmd,
        node_id=state.node_id,
        until=(sb.SandboxNetworkUpdated,),
        timeout=ctx.settings.command_timeout_s,
        actor=caller.key_id,
    )


ROUTES = [update_network]
