"""Fork of a *paused* sandbox into `count` children across the fleet (issue 32): E2B's
`POST /sandboxes/{id}/fork` with the same body, answered as a running sandbox's fork is
(one `{sandbox}` or `{error}` per child) — clients need nothing new.

A paused sandbox's capture is durable once its node uploaded it (`resumable_anywhere`).
The fork lends that capture to a template of its own (`tp.paused_capture_template`:
registered, and recorded as uploaded under the capture's key, by the API) and forks that
template exactly as a persistent snapshot is forked (`api/snapfork.py::fork_template`):
the same admission, spread and copy-on-write restore, each node fetching the capture from
the repository once into a directory of its own — never the parent's capture directory,
which the parent's resume adopts and writes into. The parent is not touched: it stays
paused, and a resume of it gives its own state.

Lineage: each child's `SandboxRequested` names the parent (`forked_from`) and the fork
(`aenv.fork`), and the template it restores names the capture and the parent
(`TemplateUploaded.source_sandbox_id`).
"""

from __future__ import annotations

from typing import Any

from litestar import Request

from api import reads, wire
from api.auth import Caller
from api.context import ApiContext
from api.errors import ApiError
from api.snapfork import checked_fork, fork_template
from bus.decisions import execute
from domain import sandbox as sb
from domain import template as tp
from domain.sandbox.values import SandboxStatus as S

__all__ = ["fork_paused", "forkable_capture", "holds_memory", "is_paused"]

#: How soon a client may ask again while the pause's capture is uploading (its upload
#: starts ~2 s after the pause: `workers/snapshot/worker.py::PAUSE_UPLOAD_DELAY_S`).
RETRY_AFTER_S = 2


def is_paused(state: sb.Sandbox) -> bool:
    """Whether a fork of `state` is a paused sandbox's (this module's), not a running one's."""
    return state.status in (S.PAUSING, S.PAUSED)


def forkable_capture(state: sb.Sandbox) -> str:
    """The durable capture a fork of the paused sandbox `state` restores; a 409 (E2B's body)
    while it is being paused or its capture is not in the repository yet, or when it holds
    volumes (a copy would be a second writer of the same disk)."""
    sid = state.sandbox_id
    if state.volume_mounts:
        names = ", ".join(m.name for m in state.volume_mounts)
        raise ApiError(
            409,
            f"cannot fork sandbox {sid}: it has volumes mounted ({names}), and a volume is "
            "attached to one sandbox at a time",
        )
    capture = state.paused_snapshot_id
    if state.status is not S.PAUSED or capture is None or not state.resumable_anywhere:
        raise ApiError(
            409,
            f"sandbox {sid} is being paused: its capture is not in the snapshot repository "
            f"yet, and a paused sandbox forks from there; retry in a few seconds",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    return capture


def holds_memory(events: list[object], capture: str) -> bool:
    """Whether the pause that took `capture` kept the guest's memory (a filesystem-only
    pause's capture boots, it does not restore: no child could start from it)."""
    return not any(
        isinstance(e, sb.SandboxPaused) and e.snapshot_id == capture and not e.memory
        for e in events
    )


async def _check_memory(ctx: ApiContext, state: sb.Sandbox, capture: str) -> None:
    records = await ctx.bus.sandboxes.read(state.sandbox_id)
    if not holds_memory([r.event for r in records], capture):
        raise ApiError(
            409,
            f"sandbox {state.sandbox_id} was paused without its memory (a filesystem-only "
            "pause): its capture boots, it does not restore; resume it and pause it again "
            "to fork it",
        )


async def _capture_template(ctx: ApiContext, state: sb.Sandbox, capture: str) -> dict[str, Any]:
    """The template row that lends `capture` to the children: registered on the first fork
    of this capture (both commands decide nothing the next time), read-your-writes."""
    name = tp.paused_capture_template(capture)
    row = await reads.template_for(ctx.engine, name)
    if row is not None and row.get("capture_key") == capture:
        return row
    register = tp.RegisterTemplate(
        template_id=name,
        alias=None,
        envd_version=state.envd_version,
        cpu_count=state.cpu_count,
        memory_mb=state.memory_mb,
        disk_size_mb=state.disk_size_mb,
        capture_id=capture,
        command_id=sb.derived_command_id("pause-fork", capture, "register"),
    )
    await execute(ctx.bus.templates, register)
    upload = tp.RecordTemplateUpload(
        template_id=name,
        key=capture,
        source_sandbox_id=state.sandbox_id,
        command_id=sb.derived_command_id("pause-fork", capture, "upload"),
    )
    _, version, _ = await execute(ctx.bus.templates, upload)
    await ctx.wait_for_templates(version.seq)
    ctx.forget(f"tpl:{name}")
    row = await reads.template_for(ctx.engine, name)
    if row is None or row.get("capture_key") != capture:  # deleted meanwhile: ask again
        raise ApiError(409, f"the capture of sandbox {state.sandbox_id} changed; retry")
    return row


async def fork_paused(
    request: Request[Any, Any, Any],
    ctx: ApiContext,
    caller: Caller,
    state: sb.Sandbox,
    data: wire.ForkBody | None,
) -> list[dict[str, Any]]:
    """`count` children of the paused sandbox `state`, spread over the nodes with room."""
    count = data.count if data and data.count is not None else 1
    # a child lives as long as its parent was asked to, unless told otherwise (as a
    # running sandbox's fork children); it carries its parent's metadata (a lease too)
    timeout = data.timeout if data and data.timeout is not None else state.timeout_s
    metadata = dict(state.metadata or {})
    await checked_fork(ctx, caller, count=count, timeout=timeout, metadata=metadata)
    capture = forkable_capture(state)
    await _check_memory(ctx, state, capture)
    tpl = await _capture_template(ctx, state, capture)
    return await fork_template(
        request,
        ctx,
        caller,
        tpl,
        count=count,
        timeout=timeout,
        metadata=metadata,
        scope=f"pause-fork:{capture}",
        forked_from=state.sandbox_id,
    )
