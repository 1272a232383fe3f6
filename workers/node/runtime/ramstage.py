"""Copies of a running VM's RAM made in memory first, so the VM stands still only for a
memory copy.

A persistent snapshot or a fork lets the VM run on afterwards, so its RAM file must be
copied while its vCPUs are stopped. Where the node's filesystem has no reflinks (ext4),
that copy writes 100+ MiB into the disk's page cache, and any fsync on the filesystem
meanwhile — Postgres commits a projection per event, SeaweedFS stores uploads — makes the
journal push dirty data to disk first: seen 250 to 370 ms for a copy that takes 35 ms on a
quiet disk, every millisecond of it a guest frozen. A copy into tmpfs is never written
back. The snapshot's `mem` is a symlink to the staged copy until `settle` copies it onto
the disk (the VM running again) and replaces the link; a fork's capture, which lives only
as long as its children map it, is never settled.

Allocating tmpfs pages costs as much as copying into them (124 MiB: 55 ms into a new
file, 25 ms into one whose pages exist), so `prepare` allocates the staged file's extents
while the VM still runs; the copy made while it stands still only fills them.

The stage is a directory of this runtime's own in `/dev/shm`, emptied when the runtime
opens and closes (a staged copy outlives nothing it is needed for: settled snapshots are
on disk, fork captures die with their children). Where the node's filesystem makes
reflinks (XFS, btrfs) nothing is staged: a reflink costs microseconds and writes nothing.
Without `/dev/shm`, or when it is full, the copy goes straight to the disk as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from shared.sparse import data_extents
from workers.node.runtime.memfile import clone_or_sparse_copy, reflink, sparse_copy

__all__ = ["RamStage"]

log = logging.getLogger(__name__)

#: Where stages live: tmpfs on every Linux we run on.
SHM = Path("/dev/shm")


class RamStage:
    """This runtime's staging directory for RAM copies (None: stage nothing)."""

    def __init__(self, root: Path | None, disk: Path | None = None) -> None:
        self.root = root
        #: the node's own filesystem (where snapshots live), probed for reflinks
        self.disk = disk

    @classmethod
    def for_state(cls, state_dir: Path, shm: Path = SHM) -> RamStage:
        """The stage of the runtime keeping its state in `state_dir`: one per state dir, so
        two runtimes on a host (a test's, a bench's) never empty each other's."""
        if not (shm.is_dir() and os.access(shm, os.W_OK)):
            return cls(None)
        digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:16]
        return cls(shm / f"aenv-ram-{digest}", state_dir)

    def reset(self) -> None:
        """Drop whatever an earlier run of this runtime staged (start-up)."""
        if self.root is None:
            return
        shutil.rmtree(self.root, ignore_errors=True)
        if self.disk is not None and _makes_reflinks(self.disk):
            log.info("RAM stage: %s makes reflinks; RAM copies are reflinks", self.disk)
            self.root = None
            return
        try:
            self.root.mkdir(mode=0o700, parents=True)
        except OSError as e:
            log.warning("RAM stage %s unusable (%s): RAM copies go to disk", self.root, e)
            self.root = None

    def close(self) -> None:
        """Drop every staged copy (the runtime closes: no VM maps them any more)."""
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)

    def prepare(self, src: Path) -> Path | None:
        """A staged file with `src`'s size and its data extents allocated, for `copy` to
        fill — made while `src`'s VM still runs. None: nothing to prepare (no stage, or
        tmpfs is full; `copy` then does without)."""
        if self.root is None:
            return None
        staged = self.root / f"{uuid.uuid4().hex}.mem"
        try:
            with open(src, "rb") as fi, open(staged, "wb") as fo:
                os.ftruncate(fo.fileno(), os.fstat(fi.fileno()).st_size)
                for start, end in data_extents(fi.fileno(), os.fstat(fi.fileno()).st_size):
                    os.posix_fallocate(fo.fileno(), start, end - start)
            return staged
        except OSError as e:
            log.warning("RAM stage: cannot prepare a copy of %s (%s)", src.name, e)
            staged.unlink(missing_ok=True)
            return None

    def release(self, prepared: Path | None) -> None:
        """Free a prepared file `copy` did not use (the capture failed before it)."""
        if prepared is not None and prepared.parent == self.root:
            prepared.unlink(missing_ok=True)

    def copy(self, src: Path, dst: Path, prepared: Path | None = None) -> str:
        """Give `dst` the content of `src` as fast as the host allows: a reflink, else a
        staged copy `dst` links to (into `prepared` if given), else a copy on the disk.
        Returns which it made."""
        if self.root is None:
            return clone_or_sparse_copy(src, dst)
        staged = prepared or self.root / f"{uuid.uuid4().hex}.mem"
        try:
            sparse_copy(src, staged, into=prepared is not None)
            os.symlink(staged, dst)
            return "staged"
        except OSError as e:  # tmpfs full, or gone: the disk still works
            log.warning("RAM stage: %s; copying %s to disk", e, src.name)
            staged.unlink(missing_ok=True)
        sparse_copy(src, dst)
        return "sparse"

    def staged(self, path: Path) -> Path | None:
        """The staged copy `path` links to, if it is one of ours."""
        if self.root is None or not path.is_symlink():
            return None
        target = Path(os.readlink(path))
        return target if target.parent == self.root else None

    def settle(self, path: Path, pause_point: Callable[[], None] | None = None) -> bool:
        """Put the staged copy `path` links to on the disk in its place (atomically: a
        reader opens either one, with the same bytes) and free the stage. False if `path`
        was not staged."""
        staged = self.staged(path)
        if staged is None:
            return False
        tmp = path.with_name(f".{path.name}.settling")
        try:
            sparse_copy(staged, tmp, pause_point)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        staged.unlink(missing_ok=True)
        return True

    def discard(self, path: Path) -> None:
        """Free the staged copy `path` links to (its snapshot is being deleted)."""
        staged = self.staged(path)
        if staged is not None:
            with contextlib.suppress(OSError):
                staged.unlink()


def _makes_reflinks(directory: Path) -> bool:
    """Whether files in `directory` can be reflinked (probed with two tiny files)."""
    probe = directory / f".reflink-probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.write_bytes(b"x" * 4096)
        return reflink(probe, probe.with_suffix(".copy"))
    except OSError:
        return False
    finally:
        probe.unlink(missing_ok=True)
        probe.with_suffix(".copy").unlink(missing_ok=True)
