"""The restart reconcile (`workers.node.reconcile`) of a node killed in the middle of a
resume: the journal already says "running" (the VM came up) but the log does not hold the
resume yet, so the capture is still whole on disk — it must be taken back, never the
sandbox killed as lost (the spent-capture window of issue 30)."""

from __future__ import annotations

from pathlib import Path

from domain import sandbox as sb
from tests.unit.domain.builders import SID, paused, resuming, running
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


async def _reconcile(state: sb.Sandbox, journal: Journal, host: _Host) -> list[str]:
    killed: list[str] = []

    async def kill(cmd: sb.KillSandbox, why: str) -> None:
        killed.append(why)

    await reconcile(
        _Store(state),  # type: ignore[arg-type]
        host,  # type: ignore[arg-type]
        journal,
        "n1",
        lambda s: GuestConfig(),
        kill,
    )
    return killed


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
