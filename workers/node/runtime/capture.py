"""Capturing a VM: stop it, freeze its disk, write its device state, keep or copy its RAM.

The one procedure behind a pause (the VM is consumed: its RAM file and top layer become the
capture without copying) and a live capture for a fork or a persistent snapshot (the VM
runs on over a fresh layer; its RAM is copied, staged in memory while the guest stands
still for as short a time as the copy and the state write overlapped allow).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path

from workers.node.image.content import content_of
from workers.node.runtime.layers import LayerStore
from workers.node.runtime.ramstage import RamStage
from workers.node.runtime.snapshot import Snapshot
from workers.node.runtime.vm import Vm, sparse_like

__all__ = ["disk_contents", "take_capture", "take_disk_capture"]

log = logging.getLogger(__name__)


async def disk_contents(vm: Vm) -> tuple[str | None, str | None]:
    """What the capture's layers were written over: the content digests of the VM's base
    image and runtime disk (recorded at build; hashed once for a disk built before), read
    once the VM stands still no longer. Never fails the capture it is for: a digest that
    cannot be read is None, and such a capture stays on this node."""

    def read(disk: Path) -> str | None:
        try:
            return content_of(disk)
        except Exception:
            log.exception("no content digest for %s: its captures stay on this node", disk)
            return None

    def both() -> tuple[str | None, str | None]:
        return read(vm.base_image), read(vm.runtime_disk)

    return await asyncio.to_thread(both)  # one thread hop


async def take_capture(
    vm: Vm,
    sdir: Path,
    snapshot_id: str,
    *,
    resume: bool,
    detach: bool,
    layers: LayerStore,
    stage: RamStage,
) -> Snapshot:
    """The capture of `vm` in `sdir` (written, manifest last). resume=False leaves the VM's
    QEMU stopped (quit unless `detach`): the caller releases it."""
    copies_ram = resume and vm.mem_shared
    prepared: Path | None = None
    copying: asyncio.Future[str] | None = None
    try:
        if copies_ram:  # the copy's pages are allocated while the guest still runs
            prepared = await asyncio.to_thread(stage.prepare, vm.mem_file)
        await vm.qemu.stop()
        stopped_at = time.monotonic()
        if copies_ram:
            # RAM is copied in a thread while QEMU switches disks and writes the device
            # state (neither touches guest RAM): the guest stands still for the longer
            # of the two, not their sum. Staged in memory; `persist` puts it on disk.
            copying = asyncio.ensure_future(
                asyncio.to_thread(stage.copy, vm.mem_file, sdir / "mem", prepared)
            )
        frozen = vm.disk_top
        if resume:
            new_top = layers.new_path()
            # QEMU creates new_top itself, backed by the current top, and switches to it.
            await vm.qemu.snapshot_disk(new_top)
            layers.stacked(new_top, frozen)
            vm.disk_top = new_top
            vm.owned_layers = [new_top]
        state_bytes = await vm.qemu.save_state(sdir / "state")
        if not vm.mem_shared:
            # A copy-on-write child maps someone else's snapshot: all its RAM went into
            # the state stream; the snapshot's `mem` is a placeholder of the right size.
            sparse_like(vm.mem_file, sdir / "mem")
        if resume:
            if copying is not None:
                await copying
            await vm.qemu.cont()
        else:
            if not (detach and vm.mem_shared):
                await vm.qemu.quit()
            if vm.mem_shared:
                vm.mem_file.rename(sdir / "mem")  # the VM's own RAM file: no copy
            vm.owned_layers = []  # the frozen top now belongs to the snapshot
        stopped_ms = (time.monotonic() - stopped_at) * 1000
    except BaseException:
        if copying is not None:  # a thread: let it finish before removing its files
            await asyncio.wait({copying})
            if not copying.cancelled():
                copying.exception()  # retrieved: the error that matters is being raised
        stage.discard(sdir / "mem")
        stage.release(prepared)
        shutil.rmtree(sdir, ignore_errors=True)
        raise
    base_content, runtime_content = await disk_contents(vm)
    snap = Snapshot(
        snapshot_id=snapshot_id,
        dir=sdir,
        machine=vm.machine,
        disk_top=frozen,
        base_image=vm.base_image,
        runtime_disk=vm.runtime_disk,
        parent_vm=vm.vm_id,
        created_at=datetime.now(UTC).isoformat(),
        state_bytes=state_bytes,
        ram_in_state=not vm.mem_shared,
        stopped_ms=round(stopped_ms, 3),
        base_content=base_content,
        runtime_content=runtime_content,
    )
    snap.write()
    return snap


async def take_disk_capture(
    vm: Vm, sdir: Path, snapshot_id: str, guest_defaults: dict[str, object]
) -> Snapshot:
    """A filesystem-only capture of `vm` in `sdir`: its disk, not its memory (E2B's
    `keep_memory=False`). The caller had the guest flush its page cache first (envd
    /sync); QEMU stops and quits, closing its qcow2 cleanly, and the VM's top layer — its
    writes — becomes the capture's frozen layer. The VM is consumed: the caller releases
    it. `state` and `mem` are empty files, so the repository stores it like any capture."""
    try:
        await vm.qemu.stop()
        stopped_at = time.monotonic()
        await vm.qemu.quit()
        (sdir / "state").write_bytes(b"")
        (sdir / "mem").write_bytes(b"")
        vm.owned_layers = []  # the top now belongs to the snapshot
        stopped_ms = (time.monotonic() - stopped_at) * 1000
    except BaseException:
        shutil.rmtree(sdir, ignore_errors=True)
        raise
    base_content, runtime_content = await disk_contents(vm)
    snap = Snapshot(
        snapshot_id=snapshot_id,
        dir=sdir,
        machine=vm.machine,
        disk_top=vm.disk_top,
        base_image=vm.base_image,
        runtime_disk=vm.runtime_disk,
        parent_vm=vm.vm_id,
        created_at=datetime.now(UTC).isoformat(),
        stopped_ms=round(stopped_ms, 3),
        disk_only=True,
        guest_defaults=guest_defaults,
        base_content=base_content,
        runtime_content=runtime_content,
    )
    snap.write()
    return snap
