"""The microVM runtime the node worker drives: boot, capture, restore, fork, destroy.

Each operation that acquires several resources (network slot, disk layer, QEMU process,
directory) builds them on an exit stack, so a failure at any step undoes what was done and
leaves nothing behind. Paths: `<state>/vms/<vm>/` per running VM, `<state>/layers/` for
qcow2 layers, `<state>/snapshots/<id>/` for captured VMs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import time
import uuid
from pathlib import Path

from workers.node.foreground import Foreground, in_background
from workers.node.image import GuestImage, kernel_cmdline
from workers.node.image.runtime import build_runtime
from workers.node.net import GUEST, EgressPolicy, SlotPool, uplink
from workers.node.net.addressing import DEFAULT_SLOT_CIDR
from workers.node.net.uplink import Uplink
from workers.node.runtime.capture import take_capture, take_disk_capture
from workers.node.runtime.compat import check_compatible
from workers.node.runtime.guest import wait_and_init, wait_envd
from workers.node.runtime.layers import MAX_CHAIN_DEPTH, LayerStore
from workers.node.runtime.ramfile import keep_capture, ram_for_restore
from workers.node.runtime.rampool import RamPool
from workers.node.runtime.ramstage import RamStage
from workers.node.runtime.snapshot import Snapshot
from workers.node.runtime.vm import Timing, Vm, caps, init_vm_envd, new_id, race_exit
from workers.node.vmm import (
    AccelChoice,
    Boot,
    Incoming,
    LaunchSpec,
    Machine,
    QemuVm,
    SnapshotIncompatible,
    choose_accel,
    qemu_version,
)

log = logging.getLogger(__name__)

BOOT_ENVD_TIMEOUT = 120.0  # a cold boot under TCG on a loaded 2-core CI host


class Runtime:
    """Owns the VMs of one node. Create with `await Runtime.open(...)`, end with `close()`."""

    def __init__(
        self,
        state_dir: Path,
        pool: SlotPool,
        accel: AccelChoice,
        qemu_ver: str,
        foreground: Foreground,
        runtime_disk: Path,
    ) -> None:
        self.state_dir = state_dir
        #: envd's runtime (read-only, `image.runtime`) attached to every VM booted here; a
        #: restore attaches the one its snapshot was taken with
        self.runtime_disk = runtime_disk
        self.pool = pool
        #: restores and forks in flight: the pools' refills and teardowns wait for them
        self.foreground = foreground
        self.accel = accel
        self.qemu_version = qemu_ver
        self.layers = LayerStore(state_dir / "layers")
        self.vms: dict[str, Vm] = {}
        self.ram_pool = RamPool(
            state_dir / "ram-pool",
            settled=self.foreground.settled,
            pause_point=self.foreground.pause_point,
        )
        #: RAM copies of running VMs (persistent snapshots, forks) go through memory first
        self.ram_stage = RamStage.for_state(state_dir)
        self._releasing: dict[str, asyncio.Task[None]] = {}
        self._teardowns: set[asyncio.Task[None]] = set()
        self.uplink: Uplink | None = None

    @classmethod
    async def open(
        cls,
        state_dir: Path,
        *,
        kernel_for_probe: Path,
        pool_target: int = 2,
        slot_prefix: str = "aenv",
        slot_cidr: str = DEFAULT_SLOT_CIDR,
        egress: bool = False,
        runtime_disk: Path | None = None,
    ) -> Runtime:
        """`egress`: carry guest traffic their policy allows beyond the host (forwarding +
        NAT, `net.uplink`); without it nothing a guest sends leaves the node.
        `runtime_disk`: envd's runtime for VMs booted here (default: built or found in the
        image cache for this envd)."""
        state_dir.mkdir(parents=True, exist_ok=True)
        accel = await asyncio.to_thread(choose_accel, kernel_for_probe)
        ver = await asyncio.to_thread(qemu_version)
        foreground = Foreground()
        pool = SlotPool(
            target=pool_target, prefix=slot_prefix, cidr=slot_cidr, settled=foreground.settled
        )
        await pool.start()
        log.info("runtime: accelerator %s (%s), QEMU %s", accel.accel, accel.reason, ver)
        if runtime_disk is None:
            runtime_disk = (await asyncio.to_thread(build_runtime, progress=log.info)).path
        rt = cls(state_dir, pool, accel, ver, foreground, runtime_disk)
        await asyncio.to_thread(rt.ram_stage.reset)
        if egress:
            rt.uplink = Uplink(slot_prefix, pool.cidr)
            await asyncio.to_thread(uplink.enable, rt.uplink)
            log.info("runtime: guest egress through the host enabled (%s)", rt.uplink.slot_cidr)
        return rt

    async def close(self) -> None:
        """Destroy every VM this runtime started and every pooled slot."""
        self.foreground.closing()  # teardowns waiting for quiet: go now
        if self._releasing:
            await asyncio.wait(set(self._releasing.values()))
        if self._teardowns:
            await asyncio.wait(set(self._teardowns))
        await asyncio.gather(*(self.destroy(vm) for vm in list(self.vms.values())))
        await self.ram_pool.close()
        await self.pool.close()
        await asyncio.to_thread(self.ram_stage.close)
        if self.uplink is not None:
            await asyncio.to_thread(uplink.disable, self.uplink)

    def machine(self, *, vcpus: int, mem_mib: int) -> Machine:
        return Machine(
            qemu_version=self.qemu_version,
            accel=self.accel.accel,
            cpu=self.accel.cpu,
            vcpus=vcpus,
            mem_mib=mem_mib,
            guest_mac=GUEST.guest_mac,
        )

    # ---- boot --------------------------------------------------------------------------
    async def boot(
        self,
        *,
        kernel: Path,
        initrd: Path,
        rootfs: Path,
        cmdline: str,
        vcpus: int = 1,
        mem_mib: int = 512,
        vm_id: str | None = None,
        policy: EgressPolicy | None = None,
    ) -> Vm:
        """Cold-boot a VM from a base image (template builds only; sandboxes restore)."""
        vm_id = vm_id or new_id()
        machine = self.machine(vcpus=vcpus, mem_mib=mem_mib)
        async with contextlib.AsyncExitStack() as stack:
            slot = await self.pool.acquire(policy)
            stack.push_async_callback(self.pool.release, slot)
            workdir = self._vm_dir(vm_id)
            stack.callback(shutil.rmtree, workdir, True)
            top = await self.layers.create_top(rootfs, backing_raw=True)
            stack.callback(top.unlink, True)
            spec = LaunchSpec(
                vm_id=vm_id,
                machine=machine,
                workdir=workdir,
                mem_file=workdir / "mem",
                mem_shared=True,
                disk=top,
                runtime_disk=self.runtime_disk,
                start=Boot(kernel, initrd, cmdline),
                netns=slot.netns_path,
                **caps(machine),
            )
            qemu = await QemuVm.launch(spec)
            stack.push_async_callback(qemu.kill)
            vm = Vm(
                vm_id,
                qemu,
                slot,
                workdir,
                machine,
                spec.mem_file,
                True,
                top,
                rootfs,
                self.runtime_disk,
                [top],
            )
            stack.pop_all()
        self.vms[vm_id] = vm
        return vm

    async def wait_envd(self, vm: Vm, timeout: float = BOOT_ENVD_TIMEOUT) -> float:
        """Wait for envd, failing fast (with QEMU's output) if the VM dies meanwhile."""
        return await race_exit(vm, wait_envd(vm.host, timeout=timeout))

    # ---- capture -----------------------------------------------------------------------
    async def capture(
        self, vm: Vm, *, resume: bool, snapshot_id: str | None = None, detach: bool = False
    ) -> Snapshot:
        """Stop the VM and capture it as a snapshot.

        resume=True: the VM continues afterwards on a fresh disk layer and keeps its RAM
        file, so the snapshot gets a copy of the RAM (children must never see the parent's
        later writes; staged in memory until `persist`). resume=False: the VM is consumed;
        its RAM file and top layer become the snapshot without copying, and the VM is
        destroyed — with detach=True in the background, so a pause returns once the state
        is on disk (QEMU's exit costs more than the capture); a restore of that snapshot
        waits for the exit first (QEMU still holds the frozen layer's write lock until then).
        """
        with self.foreground.busy():  # a pause or fork is waited on: housekeeping yields
            return await self._capture(vm, resume=resume, snapshot_id=snapshot_id, detach=detach)

    async def _capture(
        self, vm: Vm, *, resume: bool, snapshot_id: str | None, detach: bool
    ) -> Snapshot:
        snapshot_id = snapshot_id or new_id()
        sdir = self.snapshot_dir(snapshot_id)
        sdir.mkdir(parents=True)
        snap = await take_capture(
            vm,
            sdir,
            snapshot_id,
            resume=resume,
            detach=detach,
            layers=self.layers,
            stage=self.ram_stage,
        )
        if not resume:
            if detach:
                task = asyncio.create_task(self._release(vm), name=f"release:{vm.vm_id}")
                self._releasing[snapshot_id] = task
                # once QEMU is gone nobody needs to wait: a snapshot never restored (its
                # sandbox killed while paused) must not keep an entry for the node's life
                task.add_done_callback(lambda _: self._releasing.pop(snapshot_id, None))
            else:
                await self.destroy(vm)
        return snap

    async def settled(self, snapshot_id: str) -> None:
        """Return once a detached capture's QEMU has exited (its files are then final)."""
        releasing = self._releasing.get(snapshot_id)
        if releasing is not None:
            await asyncio.wait({releasing})

    async def _release(self, vm: Vm) -> None:
        """End a captured VM's QEMU. SIGKILL, not `quit`: the migration to the state file
        completed, which stopped the guest and flushed and released its disks, and its RAM
        is a shared file mapping (the kernel keeps every written page). A graceful quit
        only adds tens of milliseconds that a quick resume would wait for — as would the
        network slot's teardown, which therefore goes on after this returns."""
        try:
            await vm.qemu.kill()
        finally:
            # The sandbox's resume reuses its id (and so its directory): make both ours
            # before returning, then tear down the rest in the background.
            if self.vms.get(vm.vm_id) is vm:
                del self.vms[vm.vm_id]
            with contextlib.suppress(OSError):
                gone = vm.dir.with_name(f"{vm.dir.name}.gone-{uuid.uuid4().hex[:8]}")
                vm.dir.rename(gone)
                vm.dir = gone
            task = asyncio.create_task(
                self.destroy(vm, background=True), name=f"teardown:{vm.vm_id}"
            )
            self._teardowns.add(task)
            task.add_done_callback(self._teardowns.discard)

    # ---- restore -----------------------------------------------------------------------
    async def restore(
        self,
        snap: Snapshot,
        *,
        vm_id: str | None = None,
        private_memory: bool = True,
        policy: EgressPolicy | None = None,
        wait: bool = True,
        init: dict[str, object] | None = None,
        init_token: str | None = None,
        adopt_memory: bool = False,
        run: bool = True,
        background: bool = False,
        volumes: tuple[Path | None, ...] = (),
    ) -> tuple[Vm, Timing]:
        """Start a VM from `snap`.

        background=True: a VM no client waits on (a warm pool's): not foreground work, and
        its QEMU yields the CPU to every other VM (`QemuVm.set_background`) until told
        otherwise.

        run=False leaves it loaded but stopped (no `cont`, no envd wait): a fork loads all
        its children before any of them runs, so guests do not compete with the launches.

        private_memory=True maps the snapshot's RAM copy-on-write (no copy: cheap, and many
        VMs share the page cache) — the fork path. False gives the VM its own shared RAM
        file (a sparse copy), which is what a sandbox that will later pause needs.
        adopt_memory=True (with private_memory=False) takes the snapshot's RAM file itself:
        the resume of a pause, where nobody else will ever restore that snapshot.
        `volumes`: the image each volume slot gets instead of its placeholder (in slot
        order; None leaves a slot empty).
        """
        self._check_compatible(snap, volumes)
        if snap.disk_only:
            raise SnapshotIncompatible(
                f"{snap.snapshot_id} is a filesystem-only capture: it "
                "boots (boot_disk), it does not restore"
            )
        releasing = self._releasing.pop(snap.snapshot_id, None)
        if releasing is not None:  # the paused VM's QEMU may still be exiting
            await asyncio.wait({releasing})
        vm_id = vm_id or new_id()
        t0 = time.monotonic()
        async with contextlib.AsyncExitStack() as stack:
            if not background:
                stack.enter_context(self.foreground.busy())
            slot = await self.pool.acquire(policy)
            stack.push_async_callback(self.pool.release, slot)
            workdir = self._vm_dir(vm_id)
            stack.callback(shutil.rmtree, workdir, True)
            top = await self.layers.create_top(snap.disk_top)
            stack.callback(top.unlink, True)
            mem, kept = await ram_for_restore(
                snap, workdir, stack, self.ram_pool, private=private_memory, adopt=adopt_memory
            )
            spec = LaunchSpec(
                vm_id=vm_id,
                machine=snap.machine,
                workdir=workdir,
                mem_file=mem,
                mem_shared=not private_memory,
                disk=top,
                runtime_disk=snap.runtime_disk,
                start=Incoming(snap.state, ram_in_stream=snap.ram_in_state),
                netns=slot.netns_path,
                volumes=volumes,
                background=background,
                **caps(snap.machine),
            )
            qemu = await QemuVm.launch(spec)
            stack.push_async_callback(qemu.kill)
            if run:
                if kept is not None:
                    await keep_capture(snap, kept)
                await qemu.cont()
            t_running = time.monotonic() - t0
            vm = Vm(
                vm_id,
                qemu,
                slot,
                workdir,
                snap.machine,
                mem,
                not private_memory,
                top,
                snap.base_image,
                snap.runtime_disk,
                [top],
            )
            t_envd = t_running
            if wait and run:
                await init_vm_envd(vm, init, init_token)
                t_envd = time.monotonic() - t0
            stack.pop_all()
        self.vms[vm_id] = vm
        return vm, Timing(total=time.monotonic() - t0, running=t_running, envd=t_envd)

    async def capture_disk(
        self, vm: Vm, *, snapshot_id: str, guest_defaults: dict[str, object]
    ) -> Snapshot:
        """A filesystem-only capture (its disk, not its memory) of a VM whose guest flushed
        its writes; the VM is consumed, its QEMU gone and its slot torn down in the
        background."""
        with self.foreground.busy():
            sdir = self.snapshot_dir(snapshot_id)
            sdir.mkdir(parents=True)
            snap = await take_disk_capture(vm, sdir, snapshot_id, guest_defaults)
            task = asyncio.create_task(self._release(vm), name=f"release:{vm.vm_id}")
            self._teardowns.add(task)
            task.add_done_callback(self._teardowns.discard)
            return snap

    async def boot_disk(
        self,
        snap: Snapshot,
        *,
        vm_id: str,
        policy: EgressPolicy | None = None,
        init: dict[str, object] | None = None,
        init_token: str | None = None,
        volumes: tuple[Path | None, ...] = (),
    ) -> tuple[Vm, Timing]:
        """A VM cold-booted from a filesystem-only capture's disk (a fresh top layer over
        its frozen chain; the image's kernel and initrd): its files as they were, no
        process of before, a new boot id. envd's /init gets the capture's `guest_defaults`
        and then `init` (the sandbox's env vars, token, hostname) over them."""
        self._check_compatible(snap, volumes)
        image = GuestImage.load(snap.base_image.parent)
        t0 = time.monotonic()
        async with contextlib.AsyncExitStack() as stack:
            stack.enter_context(self.foreground.busy())
            slot = await self.pool.acquire(policy)
            stack.push_async_callback(self.pool.release, slot)
            workdir = self._vm_dir(vm_id)
            stack.callback(shutil.rmtree, workdir, True)
            top = await self.layers.create_top(snap.disk_top)
            stack.callback(top.unlink, True)
            spec = LaunchSpec(
                vm_id=vm_id,
                machine=snap.machine,
                workdir=workdir,
                mem_file=workdir / "mem",
                mem_shared=True,
                disk=top,
                runtime_disk=snap.runtime_disk,
                start=Boot(image.kernel, image.initrd, kernel_cmdline(image)),
                netns=slot.netns_path,
                volumes=volumes,
                **caps(snap.machine),
            )
            qemu = await QemuVm.launch(spec)
            stack.push_async_callback(qemu.kill)
            vm = Vm(
                vm_id,
                qemu,
                slot,
                workdir,
                snap.machine,
                spec.mem_file,
                True,
                top,
                snap.base_image,
                snap.runtime_disk,
                [top],
            )
            t_running = time.monotonic() - t0
            body: dict[str, object] = {**snap.guest_defaults, **(init or {})}
            base_env, own_env = snap.guest_defaults.get("envVars"), (init or {}).get("envVars")
            if isinstance(base_env, dict) and isinstance(own_env, dict):
                body["envVars"] = {**base_env, **own_env}  # the sandbox's values win
            await race_exit(
                vm, wait_and_init(vm.host, body, token=init_token, timeout=BOOT_ENVD_TIMEOUT)
            )
            stack.pop_all()
        self.vms[vm_id] = vm
        t = time.monotonic() - t0
        return vm, Timing(total=t, running=t_running, envd=t)

    async def fork(
        self,
        vm: Vm,
        count: int,
        *,
        wait: bool = True,
        vm_ids: list[str] | None = None,
        policy: EgressPolicy | None = None,
    ) -> tuple[Snapshot, list[Vm | BaseException]]:
        """Capture a running VM once and start `count` copy-on-write children from it.

        The parent keeps running. Per-child failures are returned, not raised, so one bad
        child does not cost the others. With wait=False the children are returned running
        but before their envd was initialised (callers init each with its own token).
        """
        with self.foreground.busy():
            return await self._fork(vm, count, wait=wait, vm_ids=vm_ids, policy=policy)

    async def _fork(
        self,
        vm: Vm,
        count: int,
        *,
        wait: bool,
        vm_ids: list[str] | None,
        policy: EgressPolicy | None,
    ) -> tuple[Snapshot, list[Vm | BaseException]]:
        ids = vm_ids or [None] * count  # type: ignore[list-item]
        snap = await self.capture(vm, resume=True)
        # Load every child first, then let them all run: on few cores, a guest already
        # running (TCG: a busy vCPU thread) slows the launches of its later siblings.
        results = await asyncio.gather(
            *(
                self.restore(snap, vm_id=i, private_memory=True, run=False, policy=policy)
                for i in ids
            ),
            return_exceptions=True,
        )
        children: list[Vm | BaseException] = [
            r if isinstance(r, BaseException) else r[0] for r in results
        ]

        async def start(child: Vm) -> Vm:
            try:
                await child.qemu.cont()
                if wait:
                    await init_vm_envd(child, None, None)
            except BaseException:
                await self.destroy(child)
                raise
            return child

        started = await asyncio.gather(
            *(start(c) for c in children if isinstance(c, Vm)), return_exceptions=True
        )
        it = iter(started)
        return snap, [c if isinstance(c, BaseException) else next(it) for c in children]

    # ---- teardown ----------------------------------------------------------------------
    async def destroy(self, vm: Vm, *, background: bool = False) -> None:
        """Kill the VM and free its slot, directory and unfrozen layers. Idempotent.
        `background`: nobody waits for the rest once QEMU is gone (a paused VM's release),
        so it is housekeeping: after the restores in flight, at the lowest priority."""
        if self.vms.get(vm.vm_id) is vm:  # not a newer VM that reuses the id (a resume)
            del self.vms[vm.vm_id]
        await vm.qemu.kill()
        if vm.slot.lock_fd is not None:
            await self.pool.release(vm.slot, background=background)
        for layer in vm.owned_layers:
            layer.unlink(missing_ok=True)
        vm.owned_layers = []
        if background:
            await in_background(shutil.rmtree, vm.dir, True)
        else:
            shutil.rmtree(vm.dir, ignore_errors=True)

    async def compact_if_deep(self, snap: Snapshot) -> Snapshot:
        """A snapshot whose disk chain grew past the limit (many pause/resume cycles) gets one
        flattened layer over the base instead; the old layers are left to `collect_layers`."""
        if await self.layers.depth(snap.disk_top) <= MAX_CHAIN_DEPTH:
            return snap
        releasing = self._releasing.get(snap.snapshot_id)
        if releasing is not None:  # qemu-img may not open the chain while QEMU holds it
            await asyncio.wait({releasing})
        flat = await self.layers.compact(snap.disk_top)
        compacted = dataclasses.replace(snap, disk_top=flat)
        compacted.write()
        log.info("snapshot %s: disk chain compacted into %s", snap.snapshot_id, flat.name)
        return compacted

    async def persist(self, snap: Snapshot) -> None:
        """Put all of a capture's files on the node's disk: a capture of a VM that ran on
        (`capture(resume=True)`) may hold its RAM in memory (`RamStage`). A snapshot that
        must outlive the node process is persisted before anyone is told it exists."""
        await asyncio.to_thread(self.ram_stage.settle, snap.mem, self.foreground.pause_point)

    def delete_snapshot(self, snap: Snapshot) -> None:
        """Remove a snapshot's own files. Its disk layers may still be under a running VM
        or another snapshot: `collect_layers` frees them once nothing needs them."""
        self.ram_stage.discard(snap.mem)
        shutil.rmtree(snap.dir, ignore_errors=True)

    async def collect_layers(self, snapshots: list[Snapshot], *, min_age_s: float = 60) -> int:
        """Delete disk layers that neither a live VM nor one of `snapshots` stacks on.

        Chains are read from the files themselves (qemu-img), so layers made before a node
        restart are judged correctly; a layer younger than `min_age_s` is never touched (a
        restore may be stacking on it right now). Returns how many were deleted.
        """
        roots = {vm.disk_top for vm in self.vms.values()} | {s.disk_top for s in snapshots}
        return len(await self.layers.collect(roots, min_age_s=min_age_s))

    def snapshot_dir(self, snapshot_id: str) -> Path:
        """Where a snapshot of this node lives (captured here, or pulled from a repository)."""
        return self.state_dir / "snapshots" / snapshot_id

    def rename(self, vm: Vm, vm_id: str) -> None:
        """Give a running VM another id — a warm VM the sandbox `vm_id` claimed — and its
        directory that name, so that `<state>/vms/<sandbox>` is the sandbox's VM whichever
        way it started. QEMU keeps its files open (RAM, console, QMP): only the paths the
        node uses change."""
        new_dir = self._vm_dir(vm_id)
        os.rename(vm.dir, new_dir)  # refuses to replace a directory that is not empty
        if self.vms.get(vm.vm_id) is vm:
            del self.vms[vm.vm_id]
        self.vms[vm_id] = vm
        spec = vm.qemu.spec
        mem = new_dir / vm.mem_file.name if vm.mem_file.parent == vm.dir else vm.mem_file
        vm.qemu.spec = dataclasses.replace(spec, vm_id=vm_id, workdir=new_dir, mem_file=mem)
        vm.vm_id, vm.dir, vm.mem_file = vm_id, new_dir, mem

    # ---- helpers -----------------------------------------------------------------------
    def _vm_dir(self, vm_id: str) -> Path:
        return self.state_dir / "vms" / vm_id

    def _check_compatible(self, snap: Snapshot, volumes: tuple[Path | None, ...] = ()) -> None:
        here = self.machine(vcpus=snap.machine.vcpus, mem_mib=snap.machine.mem_mib)
        check_compatible(here, snap, volumes)
