"""Whether a snapshot restores on this node: captured on the same machine (QEMU, accelerator,
CPU, devices), with volume slots if volumes are asked for, and with all its files here.
A restore that ignored a mismatch would fail inside QEMU with a far worse message."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from workers.node.runtime.snapshot import Snapshot
from workers.node.vmm import LAYOUTS, Machine, SnapshotIncompatible, VmmError

__all__ = ["check_compatible"]


def check_compatible(here: Machine, snap: Snapshot, volumes: tuple[Path | None, ...] = ()) -> None:
    """Raise unless `snap` restores on `here` (this node's machine of the snapshot's size)."""
    if snap.machine.devices in LAYOUTS:
        # captured before volume slots (no slots: only volumes cannot be given to it), or
        # with or without the balloon: it restores with the devices it was taken with, so
        # snapshot templates of an older aenv, or of a node with another setting, work
        here = dataclasses.replace(here, devices=snap.machine.devices)
    wanted = sum(v is not None for v in volumes)
    if wanted and len(volumes) > snap.machine.volume_slots:
        raise SnapshotIncompatible(
            f"snapshot {snap.snapshot_id} was captured without volume slots (before aenv "
            "had volumes): a sandbox of it cannot mount volumes; capture it again"
        )
    diff = here.mismatch(snap.machine)
    if diff:
        raise SnapshotIncompatible(
            f"snapshot {snap.snapshot_id} was made on a different machine: " + "; ".join(diff)
        )
    for f in (snap.state, snap.mem, snap.disk_top):
        if not f.exists():
            raise VmmError(f"snapshot {snap.snapshot_id} is incomplete: {f} is missing")
