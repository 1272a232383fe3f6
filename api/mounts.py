"""A create's `volumeMounts` (E2B's `[{name, path}]`): each name resolved to the team's
volume, each volume free for the new sandbox — else why not, at once.

A volume is attached to one sandbox at a time (`domain/volume.py`); the node that takes
the create attaches it in the log, and a race between two creates is settled there. This
is the API's look first, for the answer a client can act on: 404 for a name the team has
no volume of; 409 naming the sandbox that mounts it (running or paused: a paused guest's
page cache still holds the file system). A volume whose holder has ended is *releasing*
(its node uploads what the sandbox left): the create waits for that, up to
`AENV_VOLUME_WAIT_S`, then answers 409 with a Retry-After. A holder whose node is lost
(silent for `AENV_NODE_LOST_AFTER_S` since the sandbox ended) never will: the volume is
released on its behalf, with the content of its last release.

Placement: a create whose volumes were last released on one node goes to that node when it
has room (its copies there need no download), else to any node.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

from api import wire
from api.auth import Caller
from api.context import ApiContext
from api.errors import ApiError
from api.room import RETRY_AFTER_S
from bus.decisions import execute
from bus.envelope import MessageContext
from domain import sandbox as sb
from domain import volume as vo
from domain.sandbox import SandboxStatus

__all__ = ["free_volume", "preferred_node", "resolve_mounts"]

_ENDED = (SandboxStatus.KILLED, SandboxStatus.FAILED)
_POLL_S = 0.2


async def resolve_mounts(
    ctx: ApiContext, caller: Caller, wanted: list[wire.VolumeMount], sandbox_id: str
) -> tuple[tuple[sb.VolumeMount, ...], list[vo.Volume]]:
    """The create's mounts (normalised paths, volume ids) and the volumes as they are."""
    mounts: list[sb.VolumeMount] = []
    volumes: list[vo.Volume] = []
    for m in wanted:
        if not vo.is_volume_name(m.name):
            raise ApiError(404, f"volume '{m.name}' not found")
        path = vo.check_mount_path(m.path)
        vid = vo.volume_id_of(caller.team_id, m.name)
        volumes.append(
            await free_volume(
                ctx, vid, m.name, team_id=caller.team_id, holder=sandbox_id, actor=caller.key_id
            )
        )
        mounts.append(sb.VolumeMount(name=m.name, path=path, volume_id=vid))
    return tuple(mounts), volumes


async def free_volume(
    ctx: ApiContext,
    volume_id: str,
    name: str,
    *,
    team_id: str | None,
    holder: str | None,
    actor: str | None,
) -> vo.Volume:
    """The volume once nothing holds it (or `holder` does already): a live sandbox's is a
    409 at once; an ended holder's release is waited for (then 409 with Retry-After); a
    lost node's is released on its behalf. `team_id` None: the caller showed the volume's
    token instead of a key."""
    deadline = time.monotonic() + ctx.settings.volume_wait_s
    wanted = holder
    while True:
        state, _ = await ctx.bus.volumes.load(volume_id)
        if state is None or state.destroyed or team_id not in (None, state.team_id):
            raise ApiError(404, f"volume '{name}' not found")
        holder = state.holder
        if holder is None or holder == wanted:
            return state
        content = holder.startswith(vo.CONTENT_HOLDER_PREFIX)
        if not content and not await _ended(ctx, holder):
            raise ApiError(
                409,
                f"volume '{name}' is mounted by sandbox {holder}: a volume "
                "is mounted by one sandbox at a time (kill that one first; "
                "its files are reachable through it meanwhile)",
            )
        ended_at = state.attached_at if content else await ctx.bus.sandboxes.last_event_at(holder)
        if await _lost(ctx, state, ended_at):
            await _release_for(ctx, actor, state)
            continue
        if time.monotonic() >= deadline:
            what = (
                "a write through the volume API"
                if holder.startswith(vo.CONTENT_HOLDER_PREFIX)
                else f"sandbox {holder}, which ended: what it wrote is being made durable"
            )
            raise ApiError(
                409,
                f"volume '{name}' is being released by {what}; retry in a few seconds",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        await asyncio.sleep(_POLL_S)


async def _ended(ctx: ApiContext, sandbox_id: str) -> bool:
    state, _ = await ctx.bus.sandboxes.load(sandbox_id)
    return state is None or state.status in _ENDED


async def _lost(ctx: ApiContext, volume: vo.Volume, ended_at: datetime | None) -> bool:
    """Whether the node of an ended holder (a sandbox, or a volume API write) is gone for
    good: silent, and the holder ended longer ago than a node may be away and come back
    (`AENV_NODE_LOST_AFTER_S`)."""
    node = volume.holder_node
    if node is None or not await ctx.node_gone(node):
        return False
    lost_after = ctx.bus.settings.node_lost_after_s
    return ended_at is None or (datetime.now(UTC) - ended_at).total_seconds() > lost_after


async def _release_for(ctx: ApiContext, actor: str | None, volume: vo.Volume) -> None:
    holder = volume.holder or ""
    release = vo.ReleaseVolume(
        volume_id=volume.volume_id,
        holder=holder,
        node_id=None,
        command_id=sb.derived_command_id(holder, "release-lost", volume.volume_id),
    )
    await execute(ctx.bus.volumes, release, MessageContext(actor=actor))


def preferred_node(ctx: ApiContext, volumes: list[vo.Volume]) -> str | None:
    """The node that released all of these volumes last, if it beats and is not cordoned
    (its copies are there)."""
    nodes = {v.version.node_id if v.version else None for v in volumes}
    if len(nodes) != 1:
        return None
    (node,) = nodes
    beats = ctx.nodes.current() if ctx.nodes is not None else None
    if node is None or beats is None or node not in beats or beats[node].cordoned:
        return None
    return node
