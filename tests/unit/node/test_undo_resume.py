"""The in-memory host (the VM-less tier's) undoes a resume the log failed meanwhile as the
QEMU host does: the VM goes, and the capture it ran from is held paused again, whole —
resumable here once more — while a recorded resume's capture is released for good."""

from __future__ import annotations

from workers.node.memory import MemoryHost
from workers.node.ports import GuestConfig


async def _resumed(host: MemoryHost) -> str:
    await host.create("s1", "base", GuestConfig())
    capture = (await host.pause("s1")).snapshot_id
    await host.resume("s1")
    assert host.runs("s1") and not host.holds_paused("s1")
    return capture


async def test_an_undone_resume_holds_its_capture_paused_again() -> None:
    host = MemoryHost(capacity=2)
    gone: list[str] = []
    host.on_gone(gone.append)
    capture = await _resumed(host)
    assert await host.undo_resume("s1")
    assert not host.runs("s1") and host.held_capture("s1") == capture
    assert gone == ["s1", "s1"]  # (its pause, then its undone resume: the route goes)
    await host.resume("s1")  # and it resumes again from it
    assert host.runs("s1")


async def test_a_recorded_resume_has_no_capture_to_go_back_to() -> None:
    host = MemoryHost(capacity=2)
    await _resumed(host)
    host.resume_recorded("s1")
    assert not await host.undo_resume("s1")
    assert not host.runs("s1") and not host.holds_paused("s1")
