"""What the node's host keeps of each sandbox it holds: a running one's VM, a paused one's
capture, and a capture as the snapshot worker uploads it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from workers.node.image.content import recipe_of
from workers.node.ports import Capture, GuestConfig
from workers.node.runtime import Snapshot, Vm, allocated_bytes

__all__ = [
    "LiveSandbox",
    "LocalCapture",
    "PausedSandbox",
    "UploadedTemplate",
    "capture_size",
    "image_size",
]


@dataclass
class LiveSandbox:
    sandbox_id: str
    template_id: str
    vm: Vm
    guest: GuestConfig
    #: handed over by the warm pool (not restored for it)
    warm: bool = False
    #: where the sandbox's part of its VM's console starts (a warm VM's warm-up came first)
    console_from: int = 0


@dataclass
class PausedSandbox:
    """A paused sandbox: its capture on this node's disk, and what its guest must be told."""

    sandbox_id: str
    template_id: str
    snapshot: Snapshot
    guest: GuestConfig

    def capture(self) -> Capture:
        """What a pause answers (and a pause of it again: a redelivery)."""
        snap = self.snapshot
        return Capture(
            snap.snapshot_id, self.template_id, 0, snap.stopped_ms, memory=not snap.disk_only
        )


@dataclass(frozen=True)
class LocalCapture:
    """A capture for the snapshot worker to upload; `volumes`: (slot, volume id, image) of
    the volumes its paused sandbox holds, uploaded with it (a take-over needs them)."""

    snapshot_id: str
    dir: Path
    base_image_digest: str
    size_bytes: int
    volumes: tuple[tuple[int, str, Path], ...] = ()
    #: the image and runtime disks it stacks on (what a node without them fetches too)
    image_bytes: int = 0

    @classmethod
    def of(cls, snap: Snapshot, volumes: tuple[tuple[int, str, Path], ...] = ()) -> LocalCapture:
        return cls(
            snap.snapshot_id,
            snap.dir,
            recipe_of(snap.base_image),
            capture_size(snap),
            volumes,
            image_bytes=image_size(snap),
        )


@dataclass(frozen=True)
class UploadedTemplate:
    """A template capture marked durable (`workers.snapshot.worker.TemplateSource`): the
    sandbox it was taken of, None for an imported image."""

    sandbox_id: str | None


def capture_size(snap: Snapshot) -> int:
    return sum(allocated_bytes(p) for p in (snap.mem, snap.state, snap.disk_top))


def image_size(snap: Snapshot) -> int:
    """The disks under a capture (base image, envd's runtime), allocated bytes; a disk not
    there (moved, evicted) counts nothing."""
    return sum(allocated_bytes(p) for p in (snap.base_image, snap.runtime_disk) if p.exists())
