"""A running microVM as the runtime holds it, and what is done to one VM alone: racing a
wait against its death, envd's /init, its process caps."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from workers.node.net import NetworkSlot
from workers.node.runtime.guest import wait_and_init
from workers.node.vmm import Machine, QemuVm, VmTimeout

__all__ = ["Timing", "Vm", "caps", "init_vm_envd", "new_id", "race_exit", "sparse_like"]

T = TypeVar("T")

# QEMU's own memory beyond guest RAM: TCG translation cache, device emulation, heap.
QEMU_OVERHEAD_MIB = 512
# Emulation threads (I/O, migration) need a little CPU beyond the vCPUs themselves.
CPU_HEADROOM = 0.5
RESTORE_ENVD_TIMEOUT = 30.0


@dataclass
class Vm:
    """A running microVM and everything it holds on the host."""

    vm_id: str
    qemu: QemuVm
    slot: NetworkSlot
    dir: Path
    machine: Machine
    mem_file: Path
    mem_shared: bool
    disk_top: Path
    base_image: Path
    runtime_disk: Path
    owned_layers: list[Path] = field(default_factory=list)

    def move_to(self, vm_id: str, new_dir: Path) -> None:
        """This VM under another id and directory (`Runtime.rename`)."""
        os.rename(self.dir, new_dir)  # refuses to replace a directory that is not empty
        mem = new_dir / self.mem_file.name if self.mem_file.parent == self.dir else self.mem_file
        spec = dataclasses.replace(self.qemu.spec, vm_id=vm_id, workdir=new_dir, mem_file=mem)
        self.qemu.spec = spec
        self.vm_id, self.dir, self.mem_file = vm_id, new_dir, mem

    @property
    def host(self) -> str:
        """Address the node dials to reach this guest's TCP ports."""
        return self.slot.host_reachable_ip


@dataclass(frozen=True)
class Timing:
    """Where the time of one restore went (for benchmarks and logs)."""

    total: float
    running: float  # QEMU started, state loaded, vCPUs running
    envd: float  # envd answered /health


async def race_exit(vm: Vm, work: Awaitable[T]) -> T:
    """`work` on the VM, failing fast (with QEMU's output) if the VM dies meanwhile."""
    probe = asyncio.ensure_future(work)
    died = asyncio.ensure_future(vm.qemu.wait_exit())
    done, _ = await asyncio.wait({probe, died}, return_when=asyncio.FIRST_COMPLETED)
    if probe in done:
        died.cancel()
        return probe.result()
    probe.cancel()
    with contextlib.suppress(BaseException):
        await probe
    raise vm.qemu.crash_error()


async def init_vm_envd(vm: Vm, init: dict[str, object] | None, token: str | None) -> None:
    """envd's /init as soon as it answers; a timeout says what the guest console said."""
    try:
        await race_exit(vm, wait_and_init(vm.host, init, token=token, timeout=RESTORE_ENVD_TIMEOUT))
    except VmTimeout as e:
        tail = vm.qemu.console_tail(1500).strip() or "(no console output)"
        raise VmTimeout(f"{e}; guest console: ...{tail[-1500:]}") from e


def sparse_like(src: Path, dst: Path) -> None:
    """An all-holes file as large as `src` (a RAM file whose content the state replaces)."""
    with open(dst, "wb") as f:
        f.truncate(src.stat().st_size)


def caps(m: Machine) -> dict[str, Any]:
    """Host-side caps for a VM's QEMU process (see vmm.limits)."""
    return {
        "mem_limit_bytes": (m.mem_mib + QEMU_OVERHEAD_MIB) << 20,
        "cpu_limit": m.vcpus + CPU_HEADROOM,
    }


def new_id() -> str:
    return uuid.uuid4().hex[:20]
