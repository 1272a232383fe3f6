from datetime import UTC, datetime

from domain import sandbox as sb

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def running() -> sb.Sandbox:
    create = sb.CreateSandbox(sandbox_id="s1", template_id="base", at=T0)
    state = sb.fold(sb.decide(None, create))
    out = sb.fold(sb.decide(state, sb.CompleteCreate(sandbox_id="s1", node_id="n", at=T0)), state)
    assert out is not None
    return out


def test_upload_is_recorded_once_per_capture() -> None:
    s = running()
    rec = sb.RecordUpload(sandbox_id="s1", snapshot_id="cap1", size_bytes=10, at=T0)
    (event,) = sb.decide(s, rec)
    assert isinstance(event, sb.SnapshotUploaded) and event.snapshot_id == "cap1"
    s2 = sb.evolve(s, event)
    assert s2 is not None and s2.durable_snapshot_id == "cap1" and s2.status is s.status
    assert sb.decide(s2, rec) == []  # again: already durable
    other = sb.RecordUpload(sandbox_id="s1", snapshot_id="cap2", size_bytes=10, at=T0)
    assert len(sb.decide(s2, other)) == 1


def test_upload_of_a_killed_sandbox_is_moot() -> None:
    s = running()
    for cmd in (sb.KillSandbox(sandbox_id="s1", at=T0), sb.CompleteKill(sandbox_id="s1", at=T0)):
        s = sb.fold(sb.decide(s, cmd), s)  # type: ignore[assignment]
    assert s.status is sb.SandboxStatus.KILLED
    assert sb.decide(s, sb.RecordUpload(sandbox_id="s1", snapshot_id="c", size_bytes=1)) == []


def _apply(s: sb.Sandbox, *cmds: sb.SandboxCommand) -> sb.Sandbox:
    for cmd in cmds:
        out = sb.fold(sb.decide(s, cmd), s)
        assert out is not None
        s = out
    return s


def test_a_paused_sandbox_is_resumable_anywhere_only_once_its_capture_is_durable() -> None:
    s = _apply(
        running(),
        sb.PauseSandbox(sandbox_id="s1", at=T0),
        sb.CompletePause(sandbox_id="s1", snapshot_id="cap1", at=T0),
    )
    assert s.paused_snapshot_id == "cap1" and not s.resumable_anywhere  # only on its disk
    s = _apply(s, sb.RecordUpload(sandbox_id="s1", snapshot_id="cap1", size_bytes=1, at=T0))
    assert s.resumable_anywhere
    s = _apply(
        s,
        sb.ResumeSandbox(sandbox_id="s1", at=T0),
        sb.CompleteResume(sandbox_id="s1", node_id="n2", at=T0),
    )
    assert s.paused_snapshot_id is None and not s.resumable_anywhere and s.node_id == "n2"
    # paused again: the older capture being durable says nothing of the new one
    s = _apply(
        s,
        sb.PauseSandbox(sandbox_id="s1", at=T0),
        sb.CompletePause(sandbox_id="s1", snapshot_id="cap2", at=T0),
    )
    assert s.durable_snapshot_id == "cap1" and not s.resumable_anywhere
