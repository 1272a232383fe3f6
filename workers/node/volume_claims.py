"""A sandbox's volumes claimed for this node in the log: attached by its create (after the
create's claim, so that a refused create holds nothing), moved by a take-over of a paused
sandbox. One holder at a time: the volume aggregate refuses a second."""

from __future__ import annotations

import logging

from bus import Bus, MessageContext
from bus.decisions import execute
from domain import DomainError, NotFound
from domain import sandbox as sb
from domain import volume as vo
from workers.node.completions import completion_id
from workers.node.ports import Host, HostError

__all__ = ["attach_volumes", "move_volumes"]

log = logging.getLogger(__name__)


async def attach_volumes(
    bus: Bus,
    host: Host,
    node_id: str,
    state: sb.Sandbox,
    cmd: sb.CreateSandbox,
    ctx: MessageContext,
) -> tuple[str | None, sb.FailureCode | None]:
    """The sandbox's volumes attached to it in the log (one holder at a time: a volume
    another sandbox holds refuses the create, 409) and their images ready here. What
    was attached before a failure stays attached to the failed sandbox; its end
    releases it (`volumes/releaser.py`)."""
    mounts = state.volume_mounts
    if not mounts:
        return None, None
    slots = await host.volume_slots(state.template_id)
    if slots < len(mounts):
        return (
            f"template {state.template_id!r} was captured without volume slots (before "
            "aenv had volumes): build or snapshot it again to mount volumes",
            "invalid",
        )
    for m in mounts:
        attach = vo.AttachVolume(
            volume_id=m.volume_id,
            holder=state.sandbox_id,
            node_id=node_id,
            command_id=completion_id(cmd, f"attach-{m.volume_id}"),
        )
        try:
            volume, _, _ = await execute(bus.volumes, attach, ctx)
        except DomainError as e:
            code: sb.FailureCode = "not_found" if isinstance(e, NotFound) else "conflict"
            return f"volume '{m.name}': {e.message}", code
        version = volume.version.key if volume is not None and volume.version else None
        try:
            async with host.volumes.lock(m.volume_id):
                await host.volumes.prepare(m.volume_id, version, state.sandbox_id)
        except Exception as e:  # a pull that failed (S3 down), a full disk
            log.exception("volume %s for %s could not be prepared", m.volume_id, state.sandbox_id)
            return f"volume '{m.name}' could not be made ready on this node: {e}", None
    return None, None


async def move_volumes(bus: Bus, node_id: str, state: sb.Sandbox) -> None:
    """A paused sandbox taken over here: its volumes' attachment moves with it (the
    node it left, should it come back, then releases nothing it no longer holds)."""
    for m in state.volume_mounts:
        move = vo.AttachVolume(
            volume_id=m.volume_id,
            holder=state.sandbox_id,
            node_id=node_id,
            command_id=sb.derived_command_id(
                state.sandbox_id,
                "take-over",
                m.volume_id,
                str(state.paused_snapshot_id),
                node_id,
            ),
        )
        try:
            await execute(bus.volumes, move, MessageContext(actor=f"node:{node_id}"))
        except DomainError as e:
            raise HostError(f"volume '{m.name}' cannot move here: {e.message}") from e
