"""The sandboxes living on this node: each a QEMU microVM restored from its template — the
production side of the `Host` port (`workers/node/ports.py`).

No bus in here: `SandboxHost` is what the node worker's handlers call after the domain has
decided, what the node's proxy asks "where does this sandbox answer?", and what the
snapshot worker asks for the captures it uploads (`LocalCaptures`). It keeps the sandbox →
VM map and the little per-sandbox state the guest needs again after a restore (env vars,
access token).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workers.node import guestcalls, recovery
from workers.node.deathwatch import DeathWatch
from workers.node.diskwatch import DiskWatch
from workers.node.garbage import Garbage
from workers.node.host_templates import HostTemplates
from workers.node.hosted import LiveSandbox, LocalCapture, PausedSandbox, capture_size
from workers.node.image.supply import ImageSupply
from workers.node.ports import (
    Accelerator,
    Capture,
    CaptureRepository,
    Claim,
    Died,
    GuestConfig,
    HostError,
    Stage,
    TemplateLocator,
    WarmStats,
)
from workers.node.runtime import Runtime, Snapshot
from workers.node.starts import VmStarts
from workers.node.templates import TemplateCatalog
from workers.node.transfer import Transfers
from workers.node.volumes.images import VolumeImages
from workers.node.warm import WarmPool
from workers.node.warmsize import WarmPolicy

__all__ = ["GuestConfig", "HostError", "LocalCapture", "SandboxHost"]

log = logging.getLogger(__name__)


class SandboxHost:
    """Creates, kills and locates this node's sandboxes."""

    def __init__(
        self,
        runtime: Runtime,
        templates: TemplateCatalog,
        *,
        capacity: int,
        repository: CaptureRepository | None = None,
        warm: WarmPolicy | None = None,
        images: ImageSupply | None = None,
    ) -> None:
        self.runtime = runtime
        self.templates = templates
        self._capacity = capacity
        #: VMs restored and warmed before anyone asked (None: no pool)
        self.warm = WarmPool(runtime, templates, warm) if warm is not None else None
        self.transfers = Transfers(runtime, templates, repository, images)
        self._volumes = VolumeImages(runtime.state_dir / "volumes", repository)
        self.sandboxes: dict[str, LiveSandbox] = {}
        self.paused: dict[str, PausedSandbox] = {}
        #: captures of resumed sandboxes whose resume the log does not hold yet
        self._resumed: dict[str, Snapshot] = {}
        self._gone_hooks: list[Callable[[str], None]] = []
        self.ram_pool_stats = runtime.ram_pool.stats  # (the Host port's)
        self._busy: dict[str, asyncio.Lock] = {}
        #: disk layers and fork captures nothing needs any more, freed off the command path
        self.garbage = Garbage(
            runtime, lambda: [p.snapshot for p in self.paused.values()] + templates.captures()
        )
        #: a VM's QEMU that exits unasked, or stands stopped on a full disk, is a `Died` call
        self._deaths = DeathWatch(self.sandboxes, self.lock)
        self.disk_watch = DiskWatch(self.sandboxes, self.lock, self._deaths)
        self._templates = HostTemplates(runtime, templates, self.warm, self.collect_soon, images)
        # (the Host port's, and the snapshot worker's `LocalCaptures`)
        self.held_templates = templates.held
        self.template_capture = self._templates.capture
        self.import_image, self.forget_template = (
            self._templates.import_image,
            self._templates.forget,
        )
        self.template_uploaded = self._templates.uploaded
        self.starts = VmStarts(
            runtime,
            templates,
            self.transfers,
            self.warm,
            self.garbage,
            self._volumes,
            running=self._running,
        )

    # ---- what the node is -------------------------------------------------------------
    @property
    def volumes(self) -> VolumeImages:
        return self._volumes

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def free(self) -> int:
        return max(0, self._capacity - len(self.sandboxes))

    @property
    def running(self) -> int:
        return len(self.sandboxes)

    @property
    def paused_count(self) -> int:
        return len(self.paused)

    @property
    def accelerator(self) -> Accelerator:
        accel = self.runtime.accel
        return Accelerator(accel.accel, accel.reason, self.runtime.qemu_version)

    def runs(self, sandbox_id: str) -> bool:
        return sandbox_id in self.sandboxes

    def holds_paused(self, sandbox_id: str) -> bool:
        return sandbox_id in self.paused

    def held_capture(self, sandbox_id: str) -> str | None:
        return held.snapshot.snapshot_id if (held := self.paused.get(sandbox_id)) else None

    def lock(self, sandbox_id: str) -> asyncio.Lock:
        return self._busy.setdefault(sandbox_id, asyncio.Lock())

    def upstream(self, sandbox_id: str) -> str | None:
        live = self.sandboxes.get(sandbox_id)
        return live.vm.host if live and live.vm.qemu.alive else None

    def on_gone(self, hook: Callable[[str], None]) -> None:
        self._gone_hooks.append(hook)

    def running_ids(self) -> list[str]:
        return list(self.sandboxes)

    async def guest_metrics(self, sandbox_id: str) -> dict[str, Any] | None:
        live = self.sandboxes.get(sandbox_id)
        if live is None or not live.vm.qemu.alive:
            return None
        return await guestcalls.metrics(live)

    def console_log(self, sandbox_id: str) -> tuple[Path, int] | None:
        live = self.sandboxes.get(sandbox_id)
        return (live.vm.qemu.spec.console_log, live.console_from) if live is not None else None

    def on_died(self, hook: Died) -> None:
        self._deaths.died = hook

    def on_stage(self, hook: Stage) -> None:
        self.starts.stage = hook

    def vm_guest_ram(self) -> dict[int, int]:
        vms = (live.vm for live in self.sandboxes.values() if live.vm.qemu.alive)
        return {vm.qemu.pid: vm.machine.mem_mib for vm in vms if vm.qemu.pid is not None}

    def _running(self, live: LiveSandbox) -> None:
        """Register a running VM and watch it: a QEMU that exits unasked (OOM, a guest
        panic) must become an event, not a sandbox `running` until a command fails."""
        self.sandboxes[live.sandbox_id] = live
        self._deaths.watch(live)
        self.disk_watch.watch(live)

    def set_template_locator(self, locate: TemplateLocator) -> None:
        self.transfers.locate = locate

    # ---- lifecycle ----------------------------------------------------------------------
    async def volume_slots(self, template_id: str) -> int:
        return (await self.transfers.available(template_id)).machine.volume_slots

    async def hold_template(self, template_id: str) -> None:
        if not self.templates.builds(template_id):  # else booted by its create: no fetch
            await self.transfers.available(template_id)

    async def create(self, sandbox_id: str, template_id: str, guest: GuestConfig) -> None:
        """A warm VM of the template handed over, else the template restored; returns once
        envd is initialised. Idempotent: a redelivery for a sandbox running here returns."""
        if sandbox_id in self.sandboxes:
            return
        if self.free <= 0:
            raise HostError("node is full")
        await self.starts.create(sandbox_id, template_id, guest)

    def started_warm(self, sandbox_id: str) -> bool:
        live = self.sandboxes.get(sandbox_id)
        return live is not None and live.warm

    def start_warm_pool(self, spare_mib: Callable[[], int]) -> None:
        if self.warm is not None:
            self.warm.spare_mib = spare_mib
            self.warm.start()

    def warm_stats(self) -> WarmStats:
        return self.warm.stats() if self.warm is not None else WarmStats()

    async def pause(
        self,
        sandbox_id: str,
        *,
        keep_memory: bool = True,
        guest_defaults: dict[str, object] | None = None,
    ) -> Capture:
        """Capture the VM and release it: no process, no slot, no host RAM while paused.

        The cost is stop + device state (~10 ms) whatever the guest's RAM size: the RAM
        already lives in the sandbox's own file, which stays on disk. Without `keep_memory`
        only the disk is kept (E2B's filesystem-only pause): the guest flushes its writes
        first (envd /sync) and says what its next boot must be told. Never refused for disk
        (the user's state): over the budget it is written anyway (docs/storage.md)."""
        live = self.sandboxes.get(sandbox_id)
        if live is None:
            if sandbox_id in self.paused:
                return self.paused[sandbox_id].capture()
            raise HostError(f"sandbox {sandbox_id} is not running on this node")
        snap_id = f"{sandbox_id}-p{uuid.uuid4().hex[:8]}"
        if keep_memory and live.guest.volumes:
            # its volumes' writes on their images: a paused sandbox killed before it runs
            # again (its page cache gone with it) must not lose them
            await guestcalls.call(live, "POST", "/sync", None, timeout=60.0)
        try:
            async with self.runtime.capturing(live.vm, refuse=False, ram=keep_memory):
                if keep_memory:
                    snap = await self.runtime.capture(
                        live.vm, resume=False, snapshot_id=snap_id, detach=True
                    )
                else:
                    defaults = guest_defaults
                    if defaults is None:
                        defaults = await self.flush_guest(sandbox_id)
                    snap = await self.runtime.capture_disk(
                        live.vm, snapshot_id=snap_id, guest_defaults=defaults
                    )
                snap = await self.runtime.compact_if_deep(snap)
        except Exception as e:
            log.exception("pause %s failed", sandbox_id)
            raise HostError(f"sandbox {sandbox_id} could not be paused: {e}") from e
        del self.sandboxes[sandbox_id]
        self._gone(sandbox_id)
        paused = PausedSandbox(sandbox_id, live.template_id, snap, live.guest)
        self.paused[sandbox_id] = paused
        return paused.capture()

    async def flush_guest(self, sandbox_id: str) -> dict[str, object]:
        live = self.sandboxes.get(sandbox_id)
        if live is None:
            raise HostError(f"sandbox {sandbox_id} is not running on this node")
        return await guestcalls.flush(live)

    async def take_over_paused(
        self, sandbox_id: str, template_id: str, snapshot_id: str, guest: GuestConfig, claim: Claim
    ) -> None:
        """A paused sandbox whose node is gone, taken over (`recovery.take_over`)."""
        parts, ids = (self.transfers, self.runtime, self._volumes), (sandbox_id, template_id)
        self.paused[sandbox_id] = await recovery.take_over(*parts, *ids, snapshot_id, guest, claim)

    def adopt_paused(
        self,
        sandbox_id: str,
        template_id: str,
        snapshot_id: str,
        guest: GuestConfig,
        *,
        durable: bool,
    ) -> bool:
        """Take back a paused sandbox whose capture survived a restart (`recovery.adopt`)."""
        paused = recovery.adopt(
            self.runtime, sandbox_id, template_id, snapshot_id, guest, durable=durable
        )
        if paused is None:
            return False
        self.paused[sandbox_id] = paused
        return True

    async def sweep_leftovers(self) -> int:
        """What a crash left on disk, removed after reconcile and before any work
        (`recovery.sweep`); returns how many directories went."""
        keep = self.templates.capture_dirs() | {p.snapshot.dir for p in self.paused.values()}
        gone = await recovery.sweep(self.runtime, keep)
        if gone:
            self.collect_soon()
        return gone

    def drop_capture(self, snapshot_id: str) -> None:
        """A stale local copy (its sandbox was killed or moved); its layers go with GC."""
        self.runtime.remove_capture_dir(self.runtime.snapshot_dir(snapshot_id))
        self.collect_soon()

    async def resume(self, sandbox_id: str) -> str:
        """Restore a paused sandbox from its own capture; processes and memory intact."""
        if sandbox_id in self.sandboxes:
            return self.sandboxes[sandbox_id].template_id
        paused = self.paused.get(sandbox_id)
        if paused is None:
            raise HostError(f"sandbox {sandbox_id} has no paused state on this node")
        snap = paused.snapshot
        if snap.spent:  # a resume ran from it and failed (or the node died): its RAM moved on
            self.runtime.remove_capture_dir(snap.dir)
        if not (snap.dir / "manifest.json").exists():
            # the local capture is gone (disk replaced, spent): fetch it back; never a
            # half-restored VM, the download completes first
            fetched = await self.transfers.fetch(
                snap.snapshot_id, snap.dir, snap.base_image, f"the capture of {sandbox_id}"
            )
            paused = dataclasses.replace(paused, snapshot=fetched)
            self.paused[sandbox_id] = paused
        vm = await self.starts.resume(sandbox_id, paused)
        del self.paused[sandbox_id]
        # kept until the resume is recorded (`resume_recorded`): a node dying before that
        # still holds the capture whole (RAM copied for it); the resume, redelivered, reruns
        self._resumed[sandbox_id] = paused.snapshot
        self._running(LiveSandbox(sandbox_id, paused.template_id, vm, paused.guest))
        return paused.template_id

    async def reconfigure(self, sandbox_id: str, guest: GuestConfig) -> None:
        await self.starts.reconfigure(sandbox_id, self.sandboxes.get(sandbox_id), guest)

    def resume_recorded(self, sandbox_id: str) -> None:
        """The log holds the resume: the capture it ran from can go."""
        snap = self._resumed.pop(sandbox_id, None)
        if snap is not None:
            self.runtime.delete_snapshot(snap)
            self.collect_soon()

    async def undo_resume(self, sandbox_id: str) -> bool:
        snap, live = self._resumed.pop(sandbox_id, None), self.sandboxes.pop(sandbox_id, None)
        if live is not None:
            await self.runtime.destroy(live.vm)
            self._gone(sandbox_id)
        if snap is None or live is None:
            return False
        self.paused[sandbox_id] = PausedSandbox(sandbox_id, live.template_id, snap, live.guest)
        return True

    async def fork(self, parent_id: str, children: dict[str, GuestConfig]) -> dict[str, str | None]:
        """Children of a running sandbox, each with its own id and guest config (token);
        returns child id → error (None when it runs). The parent keeps running."""
        parent = self.sandboxes.get(parent_id)
        if parent is None:
            raise HostError(f"sandbox {parent_id} is not running on this node")
        if self.free < len(children):
            raise HostError(f"node has room for {self.free} more sandboxes, not {len(children)}")
        return await self.starts.fork(parent_id, parent, children)

    async def snapshot(self, sandbox_id: str, name: str) -> Capture:
        """A persistent snapshot of a running sandbox, which keeps running (brief pause);
        it becomes template `name` on this node."""
        live = self.sandboxes.get(sandbox_id)
        if live is None:
            raise HostError(f"sandbox {sandbox_id} is not running on this node")
        snap_id = f"snap-{uuid.uuid4().hex[:12]}"
        try:
            async with self.runtime.capturing(live.vm, refuse=True):
                snap = await self.runtime.capture(live.vm, resume=True, snapshot_id=snap_id)
                t0 = time.monotonic()
                # the sandbox runs again; its RAM copy goes to disk before the template exists
                await self.runtime.persist(snap)
                snap = await self.runtime.compact_if_deep(snap)
            log.info(
                "sandbox %s snapshot %s: paused %.1f ms, on disk %.1f ms later",
                sandbox_id,
                name,
                snap.stopped_ms,
                (time.monotonic() - t0) * 1000,
            )
        except Exception as e:
            log.exception("snapshot of %s failed", sandbox_id)
            raise HostError.about(f"sandbox {sandbox_id} could not be snapshotted", e) from e
        await self._templates.adopt_snapshot(name, snap, live.guest.access_token, sandbox_id)
        return Capture(snap.snapshot_id, live.template_id, capture_size(snap), snap.stopped_ms)

    async def kill(self, sandbox_id: str) -> bool:
        """Destroy the sandbox's VM or paused capture; False if neither was here."""
        paused = self.paused.pop(sandbox_id, None)
        if paused is not None:
            self.runtime.delete_snapshot(paused.snapshot)
        self.resume_recorded(sandbox_id)  # (a capture kept for a resume: moot now)
        live = self.sandboxes.get(sandbox_id)
        if live is not None and live.guest.volumes and live.vm.qemu.alive:
            # best effort: the volumes' writes flushed and each unmounted (or frozen), so
            # the images the releaser uploads are clean file systems
            paths = [v.path for v in live.guest.volumes]
            await guestcalls.call(live, "POST", "/volumes/release", {"paths": paths}, timeout=15.0)
        live = self.sandboxes.pop(sandbox_id, None)
        self.collect_soon()
        if live is None:
            return paused is not None
        await self.runtime.destroy(live.vm)
        self._gone(sandbox_id)
        return True

    def _gone(self, sandbox_id: str) -> None:
        for hook in self._gone_hooks:
            try:
                hook(sandbox_id)
            except Exception:  # a listener's failure must not fail the kill
                log.exception("on_gone hook failed for %s", sandbox_id)

    # ---- templates --------------------------------------------------------------------
    def reload_templates(self) -> int:
        return self.templates.reload()

    # ---- what the snapshot worker uploads (`workers.snapshot.worker.LocalCaptures`) ------
    async def paused_capture(self, sandbox_id: str, snapshot_id: str) -> LocalCapture | None:
        if self.held_capture(sandbox_id) != snapshot_id:
            return None
        paused = self.paused[sandbox_id]
        await self.runtime.settled(snapshot_id)  # the paused QEMU is gone: nothing writes
        volumes = tuple(
            (slot, v.volume_id, self._volumes.image(v.volume_id))
            for slot, v in enumerate(paused.guest.volumes)
        )
        return LocalCapture.of(paused.snapshot, volumes)

    # ---- housekeeping -------------------------------------------------------------------
    def collect_soon(self) -> None:
        self.garbage.collect_soon()

    async def collect_garbage(self) -> int:
        return await self.garbage.collect()

    async def close(self) -> None:
        if self.warm is not None:
            await self.warm.close()
        self._deaths.close()
        self.disk_watch.close()
        for sid in list(self.sandboxes):
            await self.kill(sid)
        self.garbage.close()
