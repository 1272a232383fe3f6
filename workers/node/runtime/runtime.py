"""The microVM runtime the node worker drives: boot, capture, restore, fork, destroy.

Each operation that acquires several resources (network slot, disk layer, QEMU process,
directory) builds them on an exit stack, so a failure at any step undoes what was done and
leaves nothing behind. Paths: `<state>/vms/<vm>/` per running VM, `<state>/layers/` for
qcow2 layers, `<state>/snapshots/<id>/` for captured VMs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from workers.node.foreground import Foreground
from workers.node.image import GuestImage, kernel_cmdline
from workers.node.image.runtime import build_runtime
from workers.node.net import EgressPolicy, SlotPool, uplink
from workers.node.net.addressing import DEFAULT_SLOT_CIDR
from workers.node.net.uplink import Uplink
from workers.node.runtime.capture import take_capture, take_disk_capture
from workers.node.runtime.capturefiles import CaptureFiles
from workers.node.runtime.compat import check_compatible
from workers.node.runtime.diskroom import boot_need, boot_room, restore_room, vm_start, vm_writes
from workers.node.runtime.forking import fork_children
from workers.node.runtime.guest import over_defaults, wait_and_init, wait_envd
from workers.node.runtime.layers import LayerStore
from workers.node.runtime.machines import Machines
from workers.node.runtime.ramfile import ram_for_restore, start_guest
from workers.node.runtime.rampool import DEFAULT_BUDGET, RamPool
from workers.node.runtime.ramstage import RamStage
from workers.node.runtime.snapshot import Snapshot
from workers.node.runtime.teardown import Teardowns
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
    ramkeep,
)

log = logging.getLogger(__name__)

BOOT_ENVD_TIMEOUT = 120.0  # a cold boot under TCG on a loaded 2-core CI host


class Runtime(CaptureFiles, Machines):
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
        #: VMs being ended (a paused VM's QEMU exits after the pause returns)
        self.teardowns = Teardowns(self.vms, pool, budget=lambda: self.disk_budget)
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
        ram_pool_bytes: int = DEFAULT_BUDGET,
        balloon: bool = False,
    ) -> Runtime:
        """`egress`: carry guest traffic their policy allows beyond the host (forwarding +
        NAT, `net.uplink`); without it nothing a guest sends leaves the node.
        `runtime_disk`: envd's runtime for VMs booted here (default: built or found in the
        image cache for this envd). `ram_pool_bytes`: the RAM pool's budget (`RamPool`)."""
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
        rt.ram_pool.budget = ram_pool_bytes
        rt.ram_keep, rt.balloon = await asyncio.to_thread(
            ramkeep.prepare, state_dir / "native", balloon
        )
        await asyncio.to_thread(rt.ram_stage.reset)
        if egress:
            rt.uplink = Uplink(slot_prefix, pool.cidr)
            await asyncio.to_thread(uplink.enable, rt.uplink)
            log.info("runtime: guest egress through the host enabled (%s)", rt.uplink.slot_cidr)
        return rt

    async def close(self) -> None:
        """Destroy every VM this runtime started and every pooled slot."""
        self.foreground.closing()  # teardowns waiting for quiet: go now
        await self.teardowns.drain()
        await asyncio.gather(*(self.destroy(vm) for vm in list(self.vms.values())))
        await self.ram_pool.close()
        await self.pool.close()
        await asyncio.to_thread(self.ram_stage.close)
        if self.uplink is not None:
            await asyncio.to_thread(uplink.disable, self.uplink)

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
        room = vm_writes(self.disk_budget, boot_need(mem_mib), self.starts)
        async with room, contextlib.AsyncExitStack() as stack:
            vm = await self._launch(
                stack,
                vm_id,
                policy,
                rootfs,
                backing_raw=True,
                machine=machine,
                runtime_disk=self.runtime_disk,
                start=Boot(kernel, initrd, cmdline),
                base_image=rootfs,
            )
            stack.pop_all()
        self.vms[vm_id] = vm
        return vm

    async def _launch(
        self,
        stack: contextlib.AsyncExitStack,
        vm_id: str,
        policy: EgressPolicy | None,
        backing: Path,
        *,
        machine: Machine,
        runtime_disk: Path,
        start: Boot | Incoming,
        base_image: Path,
        backing_raw: bool = False,
        memory: Callable[[Path], Awaitable[Path]] | None = None,
        mem_shared: bool = True,
        volumes: tuple[Path | None, ...] = (),
        background: bool = False,
    ) -> Vm:
        """The steps every VM start shares, each undone on `stack` if a later one fails: a
        network slot, the VM's directory, a fresh top layer over `backing`, its RAM file
        (`memory(workdir)`, else a new shared one) and QEMU launched on them."""
        slot = await self.pool.acquire(policy)
        stack.push_async_callback(self.pool.release, slot)
        workdir = self._vm_dir(vm_id)
        stack.callback(shutil.rmtree, workdir, True)
        top = await self.layers.create_top(backing, backing_raw=backing_raw)
        stack.callback(top.unlink, True)
        mem = await memory(workdir) if memory is not None else workdir / "mem"
        spec = LaunchSpec(
            vm_id=vm_id,
            machine=machine,
            workdir=workdir,
            mem_file=mem,
            mem_shared=mem_shared,
            disk=top,
            runtime_disk=runtime_disk,
            start=start,
            netns=slot.netns_path,
            volumes=volumes,
            background=background,
            ram_keep=self.ram_keep,
            **caps(machine),
        )
        qemu = await QemuVm.launch(spec)
        stack.push_async_callback(qemu.kill)
        return Vm(
            vm_id,
            qemu,
            slot,
            workdir,
            machine,
            mem,
            mem_shared,
            top,
            base_image,
            runtime_disk,
            [top],
        )

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
                    self.teardowns.release_for(snapshot_id, vm)
                else:
                    await self.destroy(vm)
            return snap

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
        counted: bool = True,
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
        order; None leaves a slot empty). counted=False: the caller reserved its disk room.
        """
        check_compatible(self.machine_like(snap), snap, volumes)
        if snap.disk_only:
            raise SnapshotIncompatible(
                f"{snap.snapshot_id} is a filesystem-only capture: it "
                "boots (boot_disk), it does not restore"
            )
        await self.teardowns.take_release(snap.snapshot_id)  # its QEMU may still be exiting
        vm_id = vm_id or new_id()
        t0 = time.monotonic()
        kept: asyncio.Task[Path | None] | None = None

        async def memory(workdir: Path) -> Path:
            nonlocal kept
            mem, kept = await ram_for_restore(
                snap, workdir, stack, self.ram_pool, private=private_memory, adopt=adopt_memory
            )
            return mem

        budget = self.disk_budget if counted else None
        room = vm_start(budget, restore_room(snap, private_memory), self.starts)
        async with room, contextlib.AsyncExitStack() as stack:
            if not background:
                stack.enter_context(self.foreground.busy())
            vm = await self._launch(
                stack,
                vm_id,
                policy,
                snap.disk_top,
                machine=snap.machine,
                runtime_disk=snap.runtime_disk,
                start=Incoming(snap.state, ram_in_stream=snap.ram_in_state),
                base_image=snap.base_image,
                memory=memory,
                mem_shared=not private_memory,
                volumes=volumes,
                background=background,
            )
            if run:
                await start_guest(snap, kept, vm.qemu.cont, resume=adopt_memory)
            t_running = t_envd = time.monotonic() - t0
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
            self.teardowns.release_later(vm)
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
        check_compatible(self.machine_like(snap), snap, volumes)
        image = GuestImage.load(snap.base_image.parent)
        t0 = time.monotonic()
        room = vm_start(self.disk_budget, boot_room(snap), self.starts)
        async with room, contextlib.AsyncExitStack() as stack:
            stack.enter_context(self.foreground.busy())
            vm = await self._launch(
                stack,
                vm_id,
                policy,
                snap.disk_top,
                machine=snap.machine,
                runtime_disk=snap.runtime_disk,
                start=Boot(image.kernel, image.initrd, kernel_cmdline(image)),
                base_image=snap.base_image,
                volumes=volumes,
            )
            t_running = time.monotonic() - t0
            body = over_defaults(snap.guest_defaults, init)
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
            async with self.capturing(vm, refuse=True, children=count):
                return await fork_children(self, vm, count, wait=wait, vm_ids=vm_ids, policy=policy)

    # ---- teardown ----------------------------------------------------------------------
    async def destroy(self, vm: Vm, *, background: bool = False) -> None:
        """Kill the VM and free its slot, directory and unfrozen layers (`Teardowns`)."""
        await self.teardowns.destroy(vm, background=background)

    def rename(self, vm: Vm, vm_id: str) -> None:
        """Give a running VM another id — a warm VM the sandbox `vm_id` claimed — and its
        directory that name, so that `<state>/vms/<sandbox>` is the sandbox's VM whichever
        way it started. QEMU keeps its files open (RAM, console, QMP): only the paths the
        node uses change."""
        old = vm.vm_id
        vm.move_to(vm_id, self._vm_dir(vm_id))  # first: a refused rename changes nothing
        if self.vms.get(old) is vm:
            del self.vms[old]
        self.vms[vm_id] = vm
