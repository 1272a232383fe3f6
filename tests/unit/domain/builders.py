"""Builders of aggregate states by folding real events: sandboxes at each point of their
lifecycle, templates after builds and tag changes."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from domain import sandbox as sb
from domain import template as tp

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
SID = "sbx1"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def step(state: sb.State, command: sb.AnySandboxCommand) -> sb.State:
    """decide then fold: one turn of the worker loop."""
    return sb.fold(sb.decide(state, command), state)


def create(**kw: object) -> sb.CreateSandbox:
    fields: dict[str, object] = {
        "sandbox_id": SID,
        "template_id": "base",
        "at": T0,
        "timeout_s": 60,
    }
    fields.update(kw)
    return sb.CreateSandbox.model_validate(fields)


def creating(**kw: object) -> sb.Sandbox:
    s = step(None, create(**kw))
    assert s is not None
    return s


def running(**kw: object) -> sb.Sandbox:
    s = step(creating(**kw), sb.CompleteCreate(sandbox_id=SID, node_id="n1", at=at(1)))
    assert s is not None and s.status is sb.SandboxStatus.RUNNING
    return s


def pausing(**kw: object) -> sb.Sandbox:
    s = step(running(**kw), sb.PauseSandbox(sandbox_id=SID, at=at(11)))
    assert s is not None
    return s


def paused(**kw: object) -> sb.Sandbox:
    s = step(pausing(**kw), sb.CompletePause(sandbox_id=SID, at=at(21), snapshot_id="p1"))
    assert s is not None
    return s


def resuming(**kw: object) -> sb.Sandbox:
    s = step(paused(**kw), sb.ResumeSandbox(sandbox_id=SID, at=at(100)))
    assert s is not None
    return s


def snapshotting() -> sb.Sandbox:
    s = step(running(), sb.SnapshotSandbox(sandbox_id=SID, at=at(5), snapshot_id="snap:v1"))
    assert s is not None
    return s


def forking() -> sb.Sandbox:
    s = step(running(), sb.ForkSandbox(sandbox_id=SID, at=at(5), count=3, timeout_s=30))
    assert s is not None
    return s


def killing() -> sb.Sandbox:
    s = step(running(), sb.KillSandbox(sandbox_id=SID, at=at(5)))
    assert s is not None
    return s


def killed() -> sb.Sandbox:
    s = step(killing(), sb.CompleteKill(sandbox_id=SID, at=at(6)))
    assert s is not None
    return s


def failed() -> sb.Sandbox:
    s = step(creating(), sb.CompleteCreate(sandbox_id=SID, node_id="n1", at=at(1), error="boom"))
    assert s is not None
    return s


STATES: dict[str, Callable[[], sb.Sandbox]] = {
    "creating": creating,
    "running": running,
    "pausing": pausing,
    "paused": paused,
    "resuming": resuming,
    "snapshotting": snapshotting,
    "forking": forking,
    "killing": killing,
    "killed": killed,
    "failed": failed,
}


# ---- templates: builds and tags -----------------------------------------------------------
TPL = "app"


def build_id(n: int) -> str:
    """The n-th build's id (a UUID, as the API hands out)."""
    return f"00000000-0000-4000-8000-{n:012d}"


def capture(n: int) -> str:
    return f"{TPL}:{build_id(n)}"


def tstep(state: tp.Template | None, command: tp.AnyTemplateCommand) -> tp.Template:
    """decide then fold, for a template: one command of the builder or the API."""
    s = tp.fold_template(tp.decide_template(state, command), state)
    assert s is not None
    return s


def publish(n: int, *tags: str, seconds: float | None = None) -> tp.PublishTemplateBuild:
    return tp.PublishTemplateBuild(
        template_id=TPL,
        alias=TPL,
        envd_version="0.6.13",
        cpu_count=1,
        memory_mb=512,
        disk_size_mb=2048,
        build_id=build_id(n),
        capture_id=capture(n),
        tags=tags,
        at=at(seconds if seconds is not None else 100 * n),
    )


def built(*builds: tuple[str, ...]) -> tp.Template:
    """The template after one successful build per entry, each taking the given tags."""
    state: tp.Template | None = None
    for n, tags in enumerate(builds, 1):
        state = tstep(state, publish(n, *tags))
    assert state is not None
    return state


def legacy() -> tp.Template:
    """A template built before tags: registered under its name, its capture its own."""
    return tstep(None, tp.RegisterTemplate(template_id=TPL, alias=TPL, at=T0))
