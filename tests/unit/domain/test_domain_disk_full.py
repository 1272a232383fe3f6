from datetime import UTC, datetime, timedelta

from domain import sandbox as sb

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def running() -> sb.Sandbox:
    create = sb.CreateSandbox(sandbox_id="s1", template_id="base", at=T0)
    state = sb.fold(sb.decide(None, create))
    out = sb.fold(sb.decide(state, sb.CompleteCreate(sandbox_id="s1", node_id="n", at=T0)), state)
    assert out is not None
    return out


def full(at: datetime = T0) -> sb.RecordDiskFull:
    return sb.RecordDiskFull(sandbox_id="s1", used_bytes=99, total_bytes=100, at=at)


def test_a_guest_filling_its_disk_is_news_and_the_sandbox_runs_on() -> None:
    s = running()
    rec = full(T0 + timedelta(seconds=5))
    (event,) = sb.decide(s, rec)
    assert isinstance(event, sb.SandboxDiskFull)
    assert (event.used_bytes, event.total_bytes, event.command_id) == (99, 100, rec.command_id)
    s2 = sb.evolve(s, event)
    assert s2 is not None and s2.status is sb.SandboxStatus.RUNNING
    assert s2.disk_full_at == T0 + timedelta(seconds=5)
    assert sb.decide(s2, rec) == []  # redelivered: recorded once
    (again,) = sb.decide(s2, full(T0 + timedelta(minutes=1)))  # a later episode: news again
    assert sb.evolve(s2, again).disk_full_at == T0 + timedelta(minutes=1)  # type: ignore[union-attr]


def test_the_clock_of_a_sandbox_whose_disk_filled_does_not_move() -> None:
    s = running()
    clock = sb.clock_of(s)
    (event,) = sb.decide(s, full())
    assert sb.tick(clock, event) == clock


def test_a_full_disk_of_a_sandbox_being_killed_is_moot() -> None:
    s = running()
    s = sb.fold(sb.decide(s, sb.KillSandbox(sandbox_id="s1", at=T0)), s)  # type: ignore[assignment]
    assert sb.decide(s, full()) == []
    s = sb.fold(sb.decide(s, sb.CompleteKill(sandbox_id="s1", at=T0)), s)  # type: ignore[assignment]
    assert sb.decide(s, full()) == []
    assert sb.decide(None, full()) == []
