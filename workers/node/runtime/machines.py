"""What the VMs a node starts are: its QEMU, accelerator and CPU, and their devices — with
the free-page-reporting balloon or without (`AENV_BALLOON`, `vmm.ramkeep`).

A facet of `Runtime` (its base class), like `CaptureFiles`: the attributes below are the
runtime's own, declared here so this module needs nothing of `runtime.py`.
"""

from __future__ import annotations

from pathlib import Path

from workers.node.net import GUEST
from workers.node.runtime.snapshot import Snapshot
from workers.node.vmm import AccelChoice, Machine, devices

__all__ = ["Machines"]


class Machines:
    qemu_version: str
    accel: AccelChoice
    #: VMs booted here get the balloon; restores take their snapshot's devices whatever
    #: this says (`runtime.compat`)
    balloon: bool = False
    #: the shim a balloon VM over a private mapping runs with (`vmm.ramkeep`)
    ram_keep: Path | None = None

    def machine_like(self, snap: Snapshot) -> Machine:
        """This node's machine of `snap`'s size: what a restore of it here would run."""
        return self.machine(vcpus=snap.machine.vcpus, mem_mib=snap.machine.mem_mib)

    def machine(self, *, vcpus: int, mem_mib: int) -> Machine:
        return Machine(
            qemu_version=self.qemu_version,
            accel=self.accel.accel,
            cpu=self.accel.cpu,
            vcpus=vcpus,
            mem_mib=mem_mib,
            guest_mac=GUEST.guest_mac,
            devices=devices(self.balloon),
        )
