"""The RAM file a restored VM runs on, and the copy a resume keeps for its capture.

A fork's child maps the capture's RAM copy-on-write; a sandbox that may pause gets a RAM
file of its own (from the RAM pool's ready copies, else a sparse copy); the resume of a
pause adopts the capture's file itself and copies it back for the capture beside QEMU's
start, so a node that dies mid-resume still holds the sandbox as it was paused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from bus.failpoints import FailpointError, failpoint
from workers.node.runtime.memfile import clone_or_sparse_copy
from workers.node.runtime.rampool import RamPool
from workers.node.runtime.snapshot import Snapshot

__all__ = ["CaptureNotKept", "keep_capture", "ram_for_restore", "start_guest"]

log = logging.getLogger(__name__)


async def ram_for_restore(
    snap: Snapshot,
    workdir: Path,
    stack: contextlib.AsyncExitStack,
    ram_pool: RamPool,
    *,
    private: bool,
    adopt: bool,
) -> tuple[Path, asyncio.Task[Path | None] | None]:
    """The RAM file for a VM restored from `snap` (`Runtime.restore`'s private_memory and
    adopt_memory), and the copy for the capture under way when the file was adopted: the
    caller hands it to `keep_capture` before the guest runs. Undone on `stack`."""
    kept: asyncio.Task[Path | None] | None = None
    if private:
        mem = snap.mem
    elif adopt:
        # Resume of a pause: the RAM file is this VM's own; take it over without a
        # copy (a hard link), while a copy for the capture is made beside QEMU's
        # start (`keep_capture`).
        workdir.mkdir(parents=True, exist_ok=True)
        mem = workdir / "mem"
        mem.unlink(missing_ok=True)
        if snap.ram_in_state:  # the stream carries the RAM: a file of its own
            fd = os.open(mem, os.O_WRONLY | os.O_CREAT, 0o644)
            os.ftruncate(fd, os.stat(snap.mem).st_size)
            os.close(fd)
        else:
            os.link(snap.mem, mem)
            kept = asyncio.create_task(asyncio.to_thread(_copy_for_capture, snap))
            stack.push_async_callback(_drop_copy, kept)
    else:
        workdir.mkdir(parents=True, exist_ok=True)
        mem = workdir / "mem"
        ready = ram_pool.take(snap.mem)
        if ready is not None:
            ready.rename(mem)  # same filesystem: O(1)
        else:
            await asyncio.to_thread(clone_or_sparse_copy, snap.mem, mem)
    return mem, kept


#: Where the copy of a capture's RAM file is made while a resume adopts the file itself.
_KEPT = "mem.kept"


class CaptureNotKept(OSError):
    """The copy of a capture's RAM file a resume needs could not be made (a full disk):
    the resume fails before its guest runs, the capture untouched — still paused."""


def _copy_for_capture(snap: Snapshot) -> Path | None:
    """A copy of the capture's RAM file (a reflink where the filesystem can, else its data
    extents), or None when it cannot be made (a full disk)."""
    dst = snap.dir / _KEPT
    try:
        failpoint("resume.copy_ram")  # a test's full disk
        clone_or_sparse_copy(snap.mem, dst)
    except (OSError, FailpointError) as e:
        log.warning("no copy of %s's RAM for its capture: %s", snap.snapshot_id, e)
        dst.unlink(missing_ok=True)
        return None
    return dst


async def keep_capture(snap: Snapshot, kept: asyncio.Task[Path | None]) -> None:
    """Before the resumed guest runs, and writes the RAM file it adopted: the capture gets
    the copy, so it stays whole until the resume is recorded and released. A node that
    dies after `cont` then still holds the sandbox as it was paused, and the resume,
    delivered again, restores it from there (or, recorded, the restart rolls it back to
    it). The copy runs while QEMU starts and loads the device state, which takes longer
    than copying the ~100 MiB a guest has touched. Without a copy (a full disk) the guest
    never runs: `CaptureNotKept`, and the restore is undone with the capture whole —
    running it would spend the capture, which a crash then could not bring back."""
    copy = await kept
    if copy is None:
        raise CaptureNotKept(
            f"no room for a copy of the capture's RAM ({snap.snapshot_id}): the sandbox "
            "stays paused on it"
        )
    os.replace(copy, snap.mem)  # the VM keeps the old inode through its own link


async def start_guest(
    snap: Snapshot,
    kept: asyncio.Task[Path | None] | None,
    cont: Callable[[], Awaitable[None]],
    *,
    resume: bool,
) -> None:
    """Run a restored VM (`cont`), the capture's RAM copy kept first when its file was
    adopted (`keep_capture`). `resume`: the restore is a pause's resume, whose steps are
    failpoints (`bus.failpoints.RESUME_POINTS`) — not the creates, warm VMs and forks."""
    point = failpoint if resume else _inert
    point("resume.after_launch")
    if kept is not None:
        await keep_capture(snap, kept)
    point("resume.before_cont")
    await cont()
    point("resume.after_cont")


def _inert(name: str) -> None:
    return None


async def _drop_copy(kept: asyncio.Task[Path | None]) -> None:
    """A restore that failed before `keep_capture`: its copy is not needed."""
    copy = await kept
    if copy is not None:
        copy.unlink(missing_ok=True)
