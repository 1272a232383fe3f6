"""A running sandbox's egress rules replaced (E2B `PUT /sandboxes/{id}/network`).

Unlike the other handlers (append the request, then act, then append the outcome) this
one acts first: the VM's firewall is swapped, then `SandboxNetworkUpdated` is appended, so
the log never names rules its guest does not live under — the event is what a resume, here
or on another node, applies again, and what `GET /sandboxes/{id}` shows. All of it under
the sandbox's host lock: a pause waits for it, and so captures the rules the log holds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from bus import Bus, MessageContext, PermanentError
from bus.decisions import execute
from domain import sandbox as sb
from workers.node.ports import GuestConfig, Host, HostError

__all__ = ["update_network"]

GuestOf = Callable[[sb.Sandbox], GuestConfig]


async def update_network(
    bus: Bus, host: Host, guest_of: GuestOf, cmd: sb.UpdateSandboxNetwork, ctx: MessageContext
) -> None:
    """Refused (paused, bad rules) before the VM is touched; applied, then recorded; put
    back as the log has it when the record is refused after all (the sandbox was paused or
    killed meanwhile by a writer that does not take the host lock)."""
    sid = cmd.sandbox_id
    async with host.lock(sid):
        state, _ = await bus.sandboxes.load(sid)
        events = sb.decide(state, cmd)
        if not events:
            return  # a redelivery: applied and recorded before
        assert state is not None  # decide refuses a sandbox that does not exist
        after = sb.fold(events, state)
        assert after is not None
        try:
            await host.reconfigure(sid, guest_of(after))
        except HostError as e:
            raise PermanentError(str(e), code="conflict") from e
        try:
            await execute(bus.sandboxes, cmd, ctx)
        except BaseException:
            with contextlib.suppress(HostError):  # gone meanwhile: no rules to put back
                await host.reconfigure(sid, guest_of(state))
            raise
