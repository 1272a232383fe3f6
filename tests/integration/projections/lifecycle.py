"""Driving one sandbox through its lifecycle the way the node worker will: load, decide,
append (no VMs: the completion commands stand in for the node's I/O)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bus import Bus, MessageContext, Version
from domain import sandbox as sb

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


async def step(bus: Bus, command: sb.SandboxCommand, actor: str = "apikey:k1") -> Version:
    """One worker turn: load, decide, append with the command as causation."""
    state, version = await bus.sandboxes.load(command.sandbox_id)
    events = sb.decide(state, command)
    ctx = MessageContext(causation_id=command.command_id, actor=actor)
    return await bus.sandboxes.append(command.sandbox_id, version, events, context=ctx)


async def full_lifecycle(bus: Bus, sid: str) -> Version:
    """create → run → pause → resume → snapshot → fork → timeout → kill."""
    await step(
        bus,
        sb.CreateSandbox(
            sandbox_id=sid,
            template_id="base",
            alias="base",
            team_id="team1",
            api_key_id="k1",
            at=at(0),
            metadata={"suite": "acc"},
            env_vars={"SECRET": "x"},
            envd_access_token="tok",
            timeout_s=120,
            lifecycle=sb.Lifecycle(on_timeout="pause"),
        ),
    )
    await step(bus, sb.CompleteCreate(sandbox_id=sid, node_id="node1", at=at(1)), "node:node1")
    await step(bus, sb.PauseSandbox(sandbox_id=sid, at=at(10)))
    await step(bus, sb.CompletePause(sandbox_id=sid, at=at(11), snapshot_id="p-1"), "node:node1")
    await step(bus, sb.ResumeSandbox(sandbox_id=sid, at=at(100)))
    await step(bus, sb.CompleteResume(sandbox_id=sid, node_id="node2", at=at(101)), "node:node2")
    await step(bus, sb.SnapshotSandbox(sandbox_id=sid, snapshot_id=f"{sid}:v1", at=at(110)))
    await step(
        bus,
        sb.CompleteSnapshot(sandbox_id=sid, snapshot_id=f"{sid}:v1", at=at(112), size_bytes=4096),
        "node:node2",
    )
    fork = sb.ForkSandbox(sandbox_id=sid, count=2, at=at(120))
    await step(bus, fork)
    state, _ = await bus.sandboxes.load(sid)
    assert state is not None
    children = state.pending_children
    await step(
        bus,
        sb.CompleteFork(
            sandbox_id=sid,
            at=at(121),
            children=(
                sb.ForkChildResult(sandbox_id=children[0]),
                sb.ForkChildResult(sandbox_id=children[1], error="out of memory"),
            ),
        ),
        "node:node2",
    )
    return await step(bus, sb.SetSandboxTimeout(sandbox_id=sid, timeout_s=600, at=at(130)))


async def kill(bus: Bus, sid: str, t: float = 200) -> Version:
    await step(bus, sb.KillSandbox(sandbox_id=sid, at=at(t)))
    return await step(bus, sb.CompleteKill(sandbox_id=sid, at=at(t + 1)), "node:node2")


async def build_lifecycle(bus: Bus, build_id: str, *, fail: bool) -> Version:
    """One template build as the API and the builder drive it: request, start, two log
    batches, then the verdict."""
    from domain import build as bd

    spec = bd.BuildSpec(from_template="base", steps=(bd.BuildStep(type="RUN", args=("x",)),))
    line = bd.BuildLogEntry(at=at(3), message="out", step="1")
    commands: list[bd.BuildCommand] = [
        bd.RequestTemplateBuild(
            build_id=build_id, template_id="tpl", alias="tpl", team_id="team1", at=at(0)
        ),
        bd.StartTemplateBuild(build_id=build_id, spec=spec, at=at(1)),
        bd.LogTemplateBuild(build_id=build_id, entries=(line, line), at=at(3)),
        bd.LogTemplateBuild(build_id=build_id, entries=(line,), at=at(4)),
        bd.CompleteTemplateBuild(
            build_id=build_id, error="boom" if fail else None, step="1" if fail else None, at=at(5)
        ),
    ]
    version = Version(0, 0)
    for cmd in commands:
        state, version = await bus.builds.load(build_id)
        ctx = MessageContext(causation_id=cmd.command_id, actor="builder")
        version = await bus.builds.append(
            build_id, version, bd.decide_build(state, cmd), context=ctx
        )
    return version
