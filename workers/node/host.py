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
import contextvars
import dataclasses
import logging
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bus import logcontext
from workers.node import guestcalls
from workers.node.garbage import Garbage
from workers.node.hosted import LiveSandbox, LocalCapture, PausedSandbox, capture_size
from workers.node.imports import convert_image
from workers.node.ports import (
    Accelerator,
    Capture,
    CaptureRepository,
    Died,
    GuestConfig,
    HostError,
    ImageSource,
    ImportedImage,
    Stage,
    TemplateLocator,
    WarmStats,
)
from workers.node.runtime import (
    Runtime,
    Snapshot,
    Vm,
    wait_and_init,
)
from workers.node.templates import TemplateCatalog, TemplateSpec
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
    ) -> None:
        self.runtime = runtime
        self.templates = templates
        self._capacity = capacity
        #: VMs restored and warmed before anyone asked (None: no pool)
        self.warm = WarmPool(runtime, templates, warm) if warm is not None else None
        self.transfers = Transfers(runtime, templates, repository)
        self._volumes = VolumeImages(runtime.state_dir / "volumes", repository)
        self.sandboxes: dict[str, LiveSandbox] = {}
        self.paused: dict[str, PausedSandbox] = {}
        #: captures of resumed sandboxes whose resume the log does not hold yet
        self._resumed: dict[str, Snapshot] = {}
        self._gone_hooks: list[Callable[[str], None]] = []
        self._busy: dict[str, asyncio.Lock] = {}
        #: disk layers and fork captures nothing needs any more, freed off the command path
        self.garbage = Garbage(
            runtime, lambda: [p.snapshot for p in self.paused.values()] + templates.captures()
        )
        #: one task per running VM, waiting for its QEMU to exit
        self._watchers: set[asyncio.Task[None]] = set()
        self._died: Died | None = None
        self._stage: Stage = lambda op, stage, seconds, start: None

    # ---- what the node is -------------------------------------------------------------
    @property
    def volumes(self) -> VolumeImages:
        return self._volumes

    def _images(self, guest: GuestConfig) -> tuple[Path | None, ...]:
        """The image of each volume slot the guest mounts (slot i: its i-th volume)."""
        return tuple(self._volumes.image(v.volume_id) for v in guest.volumes)

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
        self._died = hook

    def on_stage(self, hook: Stage) -> None:
        self._stage = hook

    def vm_pids(self) -> list[int]:
        return [
            pid
            for live in self.sandboxes.values()
            if live.vm.qemu.alive and (pid := live.vm.qemu.pid) is not None
        ]

    def _timed(self, op: str, running_s: float, envd_s: float, start: str = "cold") -> None:
        """A restore's stages (`Timing`: both from its start) to the stage hook; a warm
        VM's "restore" is its hand-over (vCPUs running again)."""
        self._stage(op, "restore", running_s, start)
        self._stage(op, "envd_ready", envd_s - running_s, start)

    def _running(self, live: LiveSandbox) -> None:
        """Register a running VM and watch it: a QEMU that exits without being asked (the
        memory cgroup killed it, the guest panicked) must become an event, not a sandbox
        that stays `running` until the next command fails."""
        self.sandboxes[live.sandbox_id] = live
        # a context of its own: the watch outlives the create that started it, and its
        # lines (a death) must not read as part of that create's trace
        task = asyncio.create_task(self._watch(live), context=contextvars.Context())
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def _watch(self, live: LiveSandbox) -> None:
        with logcontext.bound(sandbox_id=live.sandbox_id):
            await self._await_death(live)

    async def _await_death(self, live: LiveSandbox) -> None:
        code = await live.vm.qemu.wait_exit()
        async with self.lock(live.sandbox_id):  # a pause or kill under way asked for it
            if self.sandboxes.get(live.sandbox_id) is not live:
                return
        tail = live.vm.qemu.console_tail(600).strip().splitlines()[-3:]
        oom = live.vm.qemu.oom_killed()
        why = (
            f"the VM ran out of memory (its cgroup's OOM killer ended QEMU, status {code})"
            if oom
            else f"the VM exited unexpectedly (QEMU status {code})"
        )
        log.warning("sandbox %s: %s; console: %s", live.sandbox_id, why, " | ".join(tail))
        if self._died is not None:
            await self._died(live.sandbox_id, why, "oom" if oom else "crash")

    def set_template_locator(self, locate: TemplateLocator) -> None:
        self.transfers.locate = locate

    # ---- lifecycle ----------------------------------------------------------------------
    async def volume_slots(self, template_id: str) -> int:
        try:
            snap = await self.transfers.template(template_id)
        except HostError:
            raise
        except Exception as e:
            raise HostError(f"template {template_id!r} is not available here: {e}") from e
        return snap.machine.volume_slots

    async def create(self, sandbox_id: str, template_id: str, guest: GuestConfig) -> None:
        """A warm VM of the template handed over, else the template restored into a new
        VM; returns once envd in it has been initialised. Idempotent: a redelivered create
        for a sandbox already running here returns."""
        if sandbox_id in self.sandboxes:
            return
        if self.free <= 0:
            raise HostError("node is full")
        t0 = time.monotonic()
        try:
            snap = await self.transfers.template(template_id)
            claimed = None
            if self.warm is not None and not guest.volumes:  # its slots hold placeholders
                claimed = await self.warm.claim(template_id, snap, guest, sandbox_id)
            if claimed is not None:
                warm, handed = claimed
                log.info(
                    "sandbox %s up: warm, claimed in %.1f ms",
                    sandbox_id,
                    (time.monotonic() - t0) * 1000,
                )
                self._timed("create", handed.running, handed.envd, start="warm")
                console = warm.qemu.spec.console_log
                start = console.stat().st_size if console.exists() else 0
                self._running(
                    LiveSandbox(sandbox_id, template_id, warm, guest, warm=True, console_from=start)
                )
                return
            vm, timing = await self.runtime.restore(
                snap,
                vm_id=sandbox_id,
                private_memory=False,  # a sandbox can be paused: its RAM must be its own file
                policy=guest.egress,
                init=guest.init_body(sandbox_id),
                init_token=self.templates.guest_token(template_id),
                volumes=self._images(guest),
            )
        except HostError:
            raise
        except Exception as e:
            log.exception("create %s failed", sandbox_id)
            raise HostError(f"sandbox {sandbox_id} failed to start: {e}") from e
        log.info(
            "sandbox %s up: running %.1f ms, envd %.1f ms",
            sandbox_id,
            timing.running * 1000,
            timing.envd * 1000,
        )
        self._timed("create", timing.running, timing.envd)
        self._running(LiveSandbox(sandbox_id, template_id, vm, guest))

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
        already lives in the sandbox's own file, which simply stays on disk. Without
        `keep_memory` only the disk is kept (E2B's filesystem-only pause): the guest
        flushes its writes first (envd /sync) and says what its next boot must be told.
        """
        live = self.sandboxes.get(sandbox_id)
        if live is None:
            if sandbox_id in self.paused:
                return self._capture(self.paused[sandbox_id])
            raise HostError(f"sandbox {sandbox_id} is not running on this node")
        snap_id = f"{sandbox_id}-p{uuid.uuid4().hex[:8]}"
        if keep_memory and live.guest.volumes:
            # its volumes' writes on their images: a paused sandbox killed before it runs
            # again (its page cache gone with it) must not lose them
            await guestcalls.call(live, "POST", "/sync", None, timeout=60.0)
        try:
            if keep_memory:
                snap = await self.runtime.capture(
                    live.vm, resume=False, snapshot_id=snap_id, detach=True
                )
            else:
                defaults = (
                    guest_defaults
                    if guest_defaults is not None
                    else (await self.flush_guest(sandbox_id))
                )
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
        return self._capture(paused)

    async def flush_guest(self, sandbox_id: str) -> dict[str, object]:
        live = self.sandboxes.get(sandbox_id)
        if live is None:
            raise HostError(f"sandbox {sandbox_id} is not running on this node")
        return await guestcalls.flush(live)

    @staticmethod
    def _capture(paused: PausedSandbox) -> Capture:
        snap = paused.snapshot
        return Capture(
            snap.snapshot_id, paused.template_id, 0, snap.stopped_ms, memory=not snap.disk_only
        )

    async def take_over_paused(
        self, sandbox_id: str, template_id: str, snapshot_id: str, guest: GuestConfig
    ) -> None:
        """A paused sandbox whose node is gone: its capture comes from the repository (then
        `resume` it as any other), the disk chain rebuilt over this node's base image."""
        snap = await self.transfers.fetch_foreign(snapshot_id, f"the capture of {sandbox_id}")
        for slot, volume in enumerate(guest.volumes):  # as the paused guest left them
            repository = self.transfers.require(f"volume {volume.name} is on another node")
            part = self.runtime.state_dir / "volumes" / f".{volume.volume_id}.take-over"
            part.parent.mkdir(parents=True, exist_ok=True)
            try:
                await repository.download_volume(f"{snapshot_id}-v{slot}", part)
            except Exception as e:
                part.unlink(missing_ok=True)
                raise HostError(
                    f"volume {volume.name} of {sandbox_id} could not be fetched: {e}"
                ) from e
            async with self._volumes.lock(volume.volume_id):
                self._volumes.adopt(volume.volume_id, sandbox_id, part)
        self.paused[sandbox_id] = PausedSandbox(sandbox_id, template_id, snap, guest)

    def adopt_paused(
        self,
        sandbox_id: str,
        template_id: str,
        snapshot_id: str,
        guest: GuestConfig,
        *,
        durable: bool,
    ) -> bool:
        """Take back a paused sandbox whose capture survived a node restart. A capture a
        resume had already run from (the node died mid-resume) survives only through its
        copy in the repository, which the resume then pulls."""
        snapshot_dir = self.runtime.snapshot_dir(snapshot_id)
        if not (snapshot_dir / "manifest.json").exists():
            return False
        snap = Snapshot.read(snapshot_dir)
        if snap.spent and not durable:
            log.warning(
                "the capture of %s was spent by a resume cut short and is not in the repository",
                sandbox_id,
            )
            return False
        self.paused[sandbox_id] = PausedSandbox(sandbox_id, template_id, snap, guest)
        return True

    async def sweep_leftovers(self) -> int:
        """What a crash left on disk, removed after reconcile and before any work. No VM
        outlives the node process, so every VM directory is a leftover; a capture stays only
        if a paused sandbox or a template needs it (`tpl-*`: built templates, a cache by
        content). Returns how many directories went."""
        keep = self.templates.capture_dirs() | {p.snapshot.dir for p in self.paused.values()}
        state = self.runtime.state_dir
        gone = [d for d in (state / "vms").glob("*") if d.is_dir()]
        gone += [
            d
            for d in (state / "snapshots").glob("*")
            if d.is_dir() and d not in keep and not d.name.startswith("tpl-")
        ]
        for d in gone:
            log.info("removing %s: left by a crash", d)
            await asyncio.to_thread(shutil.rmtree, d, True)
        if gone:
            self.collect_soon()
        return len(gone)

    def drop_capture(self, snapshot_id: str) -> None:
        """A stale local copy (its sandbox was killed or moved); its layers go with GC."""
        shutil.rmtree(self.runtime.snapshot_dir(snapshot_id), ignore_errors=True)
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
            shutil.rmtree(snap.dir, ignore_errors=True)
        if not (snap.dir / "manifest.json").exists():
            # the local capture is gone (disk replaced, spent): fetch it back; never a
            # half-restored VM, the download completes first
            fetched = await self.transfers.fetch(
                snap.snapshot_id, snap.dir, snap.base_image, f"the capture of {sandbox_id}"
            )
            paused = dataclasses.replace(paused, snapshot=fetched)
            self.paused[sandbox_id] = paused
        try:
            if paused.snapshot.disk_only:  # a filesystem-only pause: boot its disk again
                vm, timing = await self.runtime.boot_disk(
                    paused.snapshot,
                    vm_id=sandbox_id,
                    policy=paused.guest.egress,
                    init=paused.guest.init_body(sandbox_id),
                    init_token=paused.guest.access_token,
                    volumes=self._images(paused.guest),
                )
            else:
                vm, timing = await self.runtime.restore(
                    paused.snapshot,
                    vm_id=sandbox_id,
                    private_memory=False,
                    adopt_memory=True,
                    policy=paused.guest.egress,
                    init=paused.guest.init_body(sandbox_id),
                    init_token=paused.guest.access_token,
                    volumes=self._images(paused.guest),
                )
        except Exception as e:
            log.exception("resume %s failed", sandbox_id)
            raise HostError(f"sandbox {sandbox_id} could not be resumed: {e}") from e
        log.info(
            "sandbox %s resumed: running %.1f ms, envd %.1f ms",
            sandbox_id,
            timing.running * 1000,
            timing.envd * 1000,
        )
        self._timed("resume", timing.running, timing.envd)
        del self.paused[sandbox_id]
        # kept until the resume is recorded (`resume_recorded`): a node that dies before
        # that still holds the sandbox as it was paused — its capture whole, the RAM copied
        # for it — and the resume, delivered again, restores it from there
        self._resumed[sandbox_id] = paused.snapshot
        self._running(LiveSandbox(sandbox_id, paused.template_id, vm, paused.guest))
        return paused.template_id

    def resume_recorded(self, sandbox_id: str) -> None:
        """The log holds the resume: the capture it ran from can go."""
        snap = self._resumed.pop(sandbox_id, None)
        if snap is not None:
            self.runtime.delete_snapshot(snap)
            self.collect_soon()

    async def fork(self, parent_id: str, children: dict[str, GuestConfig]) -> dict[str, str | None]:
        """Children of a running sandbox, each with its own id and guest config (token);
        returns child id → error (None when it runs). The parent keeps running."""
        parent = self.sandboxes.get(parent_id)
        if parent is None:
            raise HostError(f"sandbox {parent_id} is not running on this node")
        if self.free < len(children):
            raise HostError(f"node has room for {self.free} more sandboxes, not {len(children)}")
        ids = list(children)
        t0 = time.monotonic()
        try:
            capture, vms = await self.runtime.fork(
                parent.vm, len(ids), wait=False, vm_ids=ids, policy=parent.guest.egress
            )
        except Exception as e:
            log.exception("fork of %s failed", parent_id)
            raise HostError(f"sandbox {parent_id} could not be captured for a fork: {e}") from e
        # The capture stays on disk while children map its RAM file copy-on-write (a child's
        # pause copies what it needs); the garbage collector deletes it after the last child.
        self.garbage.fork_captures.append(capture)
        log.info("sandbox %s fork into %d: paused %.1f ms", parent_id, len(ids), capture.stopped_ms)

        async def init(cid: str, vm: Vm | BaseException) -> str | None:
            if isinstance(vm, BaseException):
                return f"child failed to start: {vm}"
            guest = children[cid]
            try:
                await wait_and_init(
                    vm.host, guest.init_body(cid), token=parent.guest.access_token, timeout=60
                )
            except Exception as e:
                await self.runtime.destroy(vm)
                return f"child envd did not initialise: {e}"
            self._running(LiveSandbox(cid, parent.template_id, vm, guest))
            return None

        running_s = time.monotonic() - t0
        errors = await asyncio.gather(*(init(c, v) for c, v in zip(ids, vms, strict=True)))
        self._timed("fork", running_s, time.monotonic() - t0)
        return dict(zip(ids, errors, strict=True))

    async def snapshot(self, sandbox_id: str, name: str) -> Capture:
        """A persistent snapshot of a running sandbox, which keeps running (brief pause);
        it becomes template `name` on this node."""
        live = self.sandboxes.get(sandbox_id)
        if live is None:
            raise HostError(f"sandbox {sandbox_id} is not running on this node")
        snap_id = f"snap-{uuid.uuid4().hex[:12]}"
        try:
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
            raise HostError(f"sandbox {sandbox_id} could not be snapshotted: {e}") from e
        old = self.templates.forget(name)
        self.templates.adopt(name, snap, live.guest.access_token, sandbox_id)
        if old is not None:  # a new build of an existing name replaces the old capture
            if self.warm is not None:  # its warm VMs were restored from the old one
                await self.warm.drain(name, forget=False)
            self.runtime.delete_snapshot(old)
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

    async def import_image(
        self,
        name: str,
        source: ImageSource,
        *,
        vcpus: int,
        mem_mib: int,
        progress: Callable[[str], None] | None = None,
    ) -> ImportedImage:
        """An image becomes a template on this node: pulled into the layer cache if it is a
        registry reference, converted (cached by content), booted once, captured and
        adopted (so a restart keeps it)."""
        image = await asyncio.to_thread(convert_image, name, source, progress)
        if self.warm is not None:  # an import again under a name: the old VMs go
            await self.warm.drain(name, forget=False)
        self.templates.register(TemplateSpec(name, vcpus=vcpus, mem_mib=mem_mib), lambda: image)
        if progress is not None:
            progress(f"booting {name} once until envd answers, then capturing it")
        snap = await self.templates.get(name)
        self.templates.adopt(name, snap, None)
        return ImportedImage(image.digest, image.rootfs.stat().st_size >> 20)

    async def forget_template(self, name: str) -> None:
        if self.warm is not None:
            await self.warm.drain(name)
        snap = self.templates.forget(name)
        if snap is not None:
            self.runtime.delete_snapshot(snap)
            self.collect_soon()

    # ---- what the snapshot worker uploads (`workers.snapshot.worker.LocalCaptures`) ------
    async def paused_capture(self, sandbox_id: str, snapshot_id: str) -> LocalCapture | None:
        paused = self.paused.get(sandbox_id)
        if paused is None or paused.snapshot.snapshot_id != snapshot_id:
            return None
        await self.runtime.settled(snapshot_id)  # the paused QEMU is gone: nothing writes
        volumes = tuple(
            (slot, v.volume_id, self._volumes.image(v.volume_id))
            for slot, v in enumerate(paused.guest.volumes)
        )
        return LocalCapture.of(paused.snapshot, volumes)

    def template_capture(self, name: str) -> LocalCapture | None:
        snap = self.templates.capture_of(name)
        return LocalCapture.of(snap) if snap is not None else None

    def template_uploaded(self, name: str, snapshot_id: str) -> str | None:
        snap = self.templates.capture_of(name)
        if snap is None or snap.snapshot_id != snapshot_id:
            return None
        if not self.templates.mark_uploaded(name, snap):
            return None
        return self.templates.source_of(name)

    # ---- housekeeping -------------------------------------------------------------------
    def collect_soon(self) -> None:
        self.garbage.collect_soon()

    async def collect_garbage(self) -> int:
        return await self.garbage.collect()

    async def close(self) -> None:
        if self.warm is not None:
            await self.warm.close()
        for task in list(self._watchers):
            task.cancel()
        for sid in list(self.sandboxes):
            await self.kill(sid)
        self.garbage.close()
