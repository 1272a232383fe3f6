"""Paused sandboxes the node takes back after the fact: a capture that survived a node
restart (adopted from this node's disk), a capture of a sandbox whose node is gone (taken
over from the repository, its volumes with it), and what a crash left on disk (swept).

Each returns what it found; the host records it in its own maps."""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path

from workers.node.hosted import PausedSandbox
from workers.node.ports import Claim, GuestConfig, HostError
from workers.node.runtime import Runtime, Snapshot
from workers.node.transfer import Transfers
from workers.node.volumes.images import VolumeImages

__all__ = ["adopt", "sweep", "take_over"]

log = logging.getLogger(__name__)


async def take_over(
    transfers: Transfers,
    runtime: Runtime,
    volumes: VolumeImages,
    sandbox_id: str,
    template_id: str,
    snapshot_id: str,
    guest: GuestConfig,
    claim: Claim = None,
) -> PausedSandbox:
    """A paused sandbox whose node is gone: its capture comes from the repository (then
    `resume` it as any other), the disk chain rebuilt over this node's base image — only
    if that holds the bytes the capture was taken over (`Transfers.fetch`); refused, the
    sandbox stays paused where it was, its volumes unclaimed (`claim` comes after)."""
    snap = await transfers.fetch_foreign(snapshot_id, f"the capture of {sandbox_id}")
    if claim is not None:
        await claim()
    for slot, volume in enumerate(guest.volumes):  # as the paused guest left them
        repository = transfers.require(f"volume {volume.name} is on another node")
        part = runtime.state_dir / "volumes" / f".{volume.volume_id}.take-over"
        part.parent.mkdir(parents=True, exist_ok=True)
        try:
            await repository.download_volume(f"{snapshot_id}-v{slot}", part)
        except Exception as e:
            part.unlink(missing_ok=True)
            raise HostError(
                f"volume {volume.name} of {sandbox_id} could not be fetched: {e}"
            ) from e
        async with volumes.lock(volume.volume_id):
            volumes.adopt(volume.volume_id, sandbox_id, part)
    return PausedSandbox(sandbox_id, template_id, snap, guest)


def adopt(
    runtime: Runtime,
    sandbox_id: str,
    template_id: str,
    snapshot_id: str,
    guest: GuestConfig,
    *,
    durable: bool,
) -> PausedSandbox | None:
    """A paused sandbox whose capture survived a node restart, or None. A capture a
    resume had already run from (the node died mid-resume) survives only through its
    copy in the repository, which the resume then pulls."""
    snapshot_dir = runtime.snapshot_dir(snapshot_id)
    if not (snapshot_dir / "manifest.json").exists():
        return None
    snap = Snapshot.read(snapshot_dir)
    if snap.spent and not durable:
        log.warning(
            "the capture of %s was spent by a resume cut short and is not in the repository",
            sandbox_id,
        )
        return None
    return PausedSandbox(sandbox_id, template_id, snap, guest)


async def sweep(runtime: Runtime, keep: set[Path]) -> int:
    """What a crash left on disk, removed. No VM outlives the node process, so every VM
    directory is a leftover; a capture stays only if it is in `keep` (a paused sandbox's or
    a template's) or is a built template's (`tpl-*`: a cache by content). Returns how many
    directories went."""
    state = runtime.state_dir
    gone = [d for d in (state / "vms").glob("*") if d.is_dir()]
    gone += [
        d
        for d in (state / "snapshots").glob("*")
        if d.is_dir() and d not in keep and not d.name.startswith("tpl-")
    ]
    for d in gone:
        log.info("removing %s: left by a crash", d)
        runtime.ram_pool.forget_under(d)
        await asyncio.to_thread(shutil.rmtree, d, True)
    return len(gone)
