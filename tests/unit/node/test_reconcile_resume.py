"""The restart reconcile (`workers.node.reconcile`) of a node killed in the middle of a
resume: the journal already says "running" (the VM came up) but the log does not hold the
resume yet, so the capture is still whole on disk — it must be taken back, never the
sandbox killed as lost (the spent-capture window of issue 30). Nor once the log holds the
resume, while the journal still names the capture it ran from (not released yet): the
sandbox is rolled back to it, paused there again."""

from __future__ import annotations

from pathlib import Path

from domain import sandbox as sb
from tests.unit.domain.builders import SID, at, paused, resuming, running, step
from workers.node.journal import Journal
from workers.node.ports import GuestConfig
from workers.node.reconcile import reconcile


class _Store:
    def __init__(self, state: sb.Sandbox) -> None:
        self.state = state

    async def load(self, sandbox_id: str) -> tuple[sb.Sandbox | None, int]:
        return (self.state, 3) if sandbox_id == self.state.sandbox_id else (None, 0)


class _Host:
    """Holds the captures named in `on_disk`; records what reconcile asked of it."""

    def __init__(self, on_disk: set[str]) -> None:
        self.on_disk = on_disk
        self.adopted: list[tuple[str, str, bool]] = []
        self.dropped: list[str] = []

    def runs(self, sandbox_id: str) -> bool:
        return False

    def holds_paused(self, sandbox_id: str) -> bool:
        return any(a[0] == sandbox_id for a in self.adopted)

    def drop_capture(self, snapshot_id: str) -> None:
        self.dropped.append(snapshot_id)

    def adopt_paused(
        self, sid: str, template_id: str, snapshot_id: str, guest: GuestConfig, *, durable: bool
    ) -> bool:
        if snapshot_id not in self.on_disk:
            return False
        self.adopted.append((sid, snapshot_id, durable))
        return True


async def _reconcile(
    state: sb.Sandbox,
    journal: Journal,
    host: _Host,
    paused_again: list[sb.PauseSandbox] | None = None,
) -> list[str]:
    killed: list[str] = []

    async def kill(cmd: sb.KillSandbox, why: str) -> None:
        killed.append(why)

    async def roll_back(cmd: sb.PauseSandbox) -> None:
        assert paused_again is not None, f"{cmd.sandbox_id} rolled back"
        paused_again.append(cmd)

    await reconcile(
        _Store(state),  # type: ignore[arg-type]
        host,  # type: ignore[arg-type]
        journal,
        "n1",
        lambda s: GuestConfig(),
        kill,
        roll_back,
    )
    return killed


def _resumed() -> sb.Sandbox:
    """Resumed on n1 from capture p1 (the log holds the resume)."""
    s = step(resuming(), sb.CompleteResume(sandbox_id=SID, node_id="n1", at=at(101)))
    assert s is not None and s.status is sb.SandboxStatus.RUNNING
    return s


async def test_a_resume_cut_after_its_vm_came_up_keeps_the_capture(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.add(SID, "base")  # what `_bring_back` writes once the VM runs: no capture named
    host = _Host(on_disk={"p1"})
    assert await _reconcile(resuming(), journal, host) == []
    assert host.adopted == [(SID, "p1", False)]


async def test_a_paused_sandbox_is_adopted_by_its_journal_entry(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.add(SID, "base", "p1")
    host = _Host(on_disk={"p1"})
    assert await _reconcile(paused(), journal, host) == []
    assert host.adopted == [(SID, "p1", False)]


async def test_a_running_sandbox_lost_its_vm(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.add(SID, "base")
    host = _Host(on_disk={"p1"})
    assert await _reconcile(running(), journal, host) == ["node restarted; VM lost"]
    assert host.adopted == []


async def test_a_resume_whose_capture_is_gone_is_reported_lost(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.add(SID, "base")
    host = _Host(on_disk=set())
    (why,) = await _reconcile(resuming(), journal, host)
    assert "paused capture is lost" in why


async def test_a_resume_recorded_but_its_capture_not_released_is_rolled_back(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path)
    journal.add(SID, "base", resumed_from="p1")  # the VM up, its resume then recorded
    host = _Host(on_disk={"p1"})
    again: list[sb.PauseSandbox] = []
    assert await _reconcile(_resumed(), journal, host, again) == []
    assert host.adopted == [(SID, "p1", False)]
    (pause,) = again
    assert pause.reason == "rollback" and pause.sandbox_id == SID
    (entry,) = journal.entries()
    assert entry.paused_snapshot == "p1"  # paused on it again, as far as the node knows
    assert entry.resumed_from == "p1"  # until the pause is in the log: a restart rolls back


async def test_a_roll_back_cut_short_rolls_back_again(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.add(SID, "base", "p1", resumed_from="p1")  # rolled back, the pause not appended
    host = _Host(on_disk={"p1"})
    again: list[sb.PauseSandbox] = []
    assert await _reconcile(_resumed(), journal, host, again) == []
    assert [p.reason for p in again] == ["rollback"]


async def test_a_released_capture_leaves_the_running_sandbox_lost(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.add(SID, "base", resumed_from="p1")
    journal.settle(SID)  # the resume recorded and its capture released: a plain crash
    assert journal.entries()[0].resumed_from is None
    host = _Host(on_disk={"p1"})  # (its deletion cut short: never taken back)
    assert await _reconcile(_resumed(), journal, host) == ["node restarted; VM lost"]
    assert host.adopted == []


async def test_no_roll_back_when_the_capture_is_gone(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.add(SID, "base", resumed_from="p1")
    host = _Host(on_disk=set())
    assert await _reconcile(_resumed(), journal, host) == ["node restarted; VM lost"]


async def test_a_roll_back_whose_pause_was_requested_is_finished(tmp_path: Path) -> None:
    """The roll-back's own pause is no queued command: a restart after its request was
    appended must finish it (no redelivery would), not merely take the capture back."""
    journal = Journal(tmp_path)
    journal.add(SID, "base", "p1", resumed_from="p1")
    pausing = step(_resumed(), sb.PauseSandbox(sandbox_id=SID, at=at(102), reason="rollback"))
    assert pausing is not None and pausing.status is sb.SandboxStatus.PAUSING
    host = _Host(on_disk={"p1"})
    again: list[sb.PauseSandbox] = []
    assert await _reconcile(pausing, journal, host, again) == []
    assert [p.reason for p in again] == ["rollback"]
