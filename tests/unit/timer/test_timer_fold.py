from datetime import UTC, datetime, timedelta
from typing import Any

from domain import sandbox as sb
from workers.timer import Timer

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def running(sid: str, ttl: int, on_timeout: str = "pause") -> list[Any]:
    create = sb.CreateSandbox(
        sandbox_id=sid,
        template_id="base",
        timeout_s=ttl,
        at=T0,
        lifecycle=sb.Lifecycle(on_timeout=on_timeout),
    )  # type: ignore[arg-type]
    events: list[Any] = list(sb.decide(None, create))
    state = sb.fold(events)
    done = sb.CompleteCreate(sandbox_id=sid, node_id="n1", at=T0)
    return events + list(sb.decide(state, done))


def timer_with(*histories: list[Any]) -> Timer:
    t = Timer(bus=None)  # type: ignore[arg-type]  # fold/expired never touch the bus
    for h in histories:
        for e in h:
            t.fold(e.sandbox_id, e)
    return t


def test_expiry_fires_once_per_end_at_and_only_when_due() -> None:
    t = timer_with(running("a", 10), running("b", 100))
    assert t.expired(T0 + timedelta(seconds=5)) == []
    due = t.expired(T0 + timedelta(seconds=11))
    assert [(type(c).__name__, c.sandbox_id) for c in due] == [("PauseSandbox", "a")]
    assert t.expired(T0 + timedelta(seconds=12)) == []  # not twice


def test_kill_lifecycle_and_extended_ttl() -> None:
    history = running("k", 10, on_timeout="kill")
    t = timer_with(history)
    extend = sb.SetSandboxTimeout(sandbox_id="k", timeout_s=60, at=T0 + timedelta(seconds=5))
    for e in sb.decide(sb.fold(history), extend):
        t.fold("k", e)
    assert t.expired(T0 + timedelta(seconds=11)) == []  # the old end_at is stale
    due = t.expired(T0 + timedelta(seconds=66))
    assert [type(c).__name__ for c in due] == ["KillSandbox"]


def test_pause_falls_back_to_kill_when_unsupported() -> None:
    t = timer_with(running("p", 1))
    t.pause_supported = False
    (cmd,) = t.expired(T0 + timedelta(seconds=2))
    assert isinstance(cmd, sb.KillSandbox) and cmd.reason == "timeout"


def test_a_seeded_timer_knows_the_read_models_clocks_and_forgets_the_ended() -> None:
    t = Timer(bus=None)  # type: ignore[arg-type]
    t.load(
        [
            sb.Clock(
                sandbox_id="s",
                status=sb.SandboxStatus.RUNNING,
                node_id="n1",
                end_at=T0 + timedelta(seconds=3),
                on_timeout="pause",
            )
        ]
    )
    (cmd,) = t.expired(T0 + timedelta(seconds=4))
    assert isinstance(cmd, sb.PauseSandbox) and cmd.sandbox_id == "s"
    killed = running("x", 10)
    t2 = timer_with(killed)
    state = sb.fold(killed)
    for cmd2 in (sb.KillSandbox(sandbox_id="x", at=T0), sb.CompleteKill(sandbox_id="x", at=T0)):
        events = sb.decide(state, cmd2)
        for e in events:
            t2.fold("x", e)
        state = sb.fold(events, state)
    assert t2.clocks == {} and t2.expired(T0 + timedelta(days=1)) == []


def test_events_of_a_sandbox_the_timer_never_knew_are_ignored() -> None:
    t = timer_with(running("y", 10)[1:])  # its request is before the timer's start
    assert t.clocks == {}


def test_a_paused_sandbox_is_kept_for_the_retention_then_killed_once() -> None:
    history = running("p", 10)
    state = sb.fold(history)
    pause = sb.PauseSandbox(sandbox_id="p", at=T0 + timedelta(seconds=1))
    for cmd in (
        pause,
        sb.CompletePause(sandbox_id="p", at=T0 + timedelta(seconds=2), snapshot_id="c1"),
    ):
        events = sb.decide(state, cmd)
        history += events
        state = sb.fold(events, state)
    t = timer_with(history)
    t.paused_retention_s = 60
    assert t.retained(T0 + timedelta(seconds=61)) == []  # paused at 2 s: kept until 62 s
    (kill,) = t.retained(T0 + timedelta(seconds=63))
    assert kill.reason == "retention" and kill.sandbox_id == "p"
    assert kill.at == T0 + timedelta(seconds=62)
    assert t.retained(T0 + timedelta(days=1)) == []  # once per pause
    assert t.expired(T0 + timedelta(days=1)) == []  # paused: no expiry either


def test_a_resume_before_the_retention_keeps_it() -> None:
    history = running("r", 10)
    state = sb.fold(history)
    for cmd in (
        sb.PauseSandbox(sandbox_id="r", at=T0),
        sb.CompletePause(sandbox_id="r", at=T0, snapshot_id="c1"),
        sb.ResumeSandbox(sandbox_id="r", at=T0 + timedelta(seconds=30)),
        sb.CompleteResume(sandbox_id="r", node_id="n1", at=T0 + timedelta(seconds=31)),
    ):
        events = sb.decide(state, cmd)
        history += events
        state = sb.fold(events, state)
    t = timer_with(history)
    t.paused_retention_s = 60
    assert t.retained(T0 + timedelta(seconds=120)) == []


def test_no_retention_keeps_paused_sandboxes_for_ever() -> None:
    clock = sb.Clock(sandbox_id="x", status=sb.SandboxStatus.PAUSED, paused_at=T0)
    assert sb.retention_command(clock, T0 + timedelta(days=999), None) is None
    assert sb.retention_command(clock, T0 + timedelta(seconds=5), 5) is not None
