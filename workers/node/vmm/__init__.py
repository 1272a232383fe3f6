"""The VMM port and its QEMU `microvm` driver (QMP over a unix socket)."""

from workers.node.vmm.accel import AccelChoice, choose_accel, qemu_version
from workers.node.vmm.argv import qemu_argv
from workers.node.vmm.errors import SnapshotIncompatible, VmCrashed, VmmError, VmTimeout
from workers.node.vmm.qemu import QemuVm
from workers.node.vmm.spec import (
    BASE_DEVICES,
    VOLUME_BYTES,
    VOLUME_SERIAL,
    VOLUME_SLOTS,
    Boot,
    Incoming,
    LaunchSpec,
    Machine,
)

__all__ = [
    "BASE_DEVICES",
    "VOLUME_BYTES",
    "VOLUME_SERIAL",
    "VOLUME_SLOTS",
    "AccelChoice",
    "Boot",
    "Incoming",
    "LaunchSpec",
    "Machine",
    "QemuVm",
    "SnapshotIncompatible",
    "VmCrashed",
    "VmTimeout",
    "VmmError",
    "choose_accel",
    "qemu_argv",
    "qemu_version",
]
