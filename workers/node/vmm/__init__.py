"""The VMM port and its QEMU `microvm` driver (QMP over a unix socket)."""

from workers.node.vmm import ramkeep
from workers.node.vmm.accel import AccelChoice, choose_accel, qemu_version
from workers.node.vmm.argv import qemu_argv
from workers.node.vmm.errors import SnapshotIncompatible, VmCrashed, VmmError, VmTimeout
from workers.node.vmm.qemu import QemuVm
from workers.node.vmm.spec import (
    BALLOON_DEVICES,
    BASE_DEVICES,
    DEVICES,
    LAYOUTS,
    VOLUME_BYTES,
    VOLUME_SERIAL,
    VOLUME_SLOTS,
    Boot,
    Incoming,
    LaunchSpec,
    Machine,
    devices,
)

__all__ = [
    "BALLOON_DEVICES",
    "BASE_DEVICES",
    "DEVICES",
    "LAYOUTS",
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
    "devices",
    "qemu_argv",
    "qemu_version",
    "ramkeep",
]
