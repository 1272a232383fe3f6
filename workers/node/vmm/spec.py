"""Value types describing a VM: what the driver launches and what a snapshot must match."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

Accel = Literal["kvm", "tcg"]

#: The devices of a machine from before volumes: root disk, envd's runtime disk
#: (read-only), network. Captures taken then restore with exactly these.
BASE_DEVICES: tuple[str, ...] = ("virtio-blk-device", "virtio-blk-device", "virtio-net-device")
#: Volume slots every VM gets at boot (microvm has no device hotplug): each a block device
#: whose drive is a placeholder, or — on a restore — a volume's image (`docs/volumes.md`).
VOLUME_SLOTS = 4
DEVICES: tuple[str, ...] = BASE_DEVICES + ("virtio-blk-device",) * VOLUME_SLOTS
#: A virtio-balloon with free page reporting, after the volume slots, on a node that turned
#: it on (`AENV_BALLOON`): pages the guest frees go back to the host within seconds and out
#: of its captures. A machine's devices say whether it has one, so captures from before it,
#: or from a node without it, restore as they were taken.
BALLOON = "virtio-balloon-device"
BALLOON_DEVICES: tuple[str, ...] = (*DEVICES, BALLOON)


def devices(balloon: bool) -> tuple[str, ...]:
    """The devices of a machine booted now, with the balloon or without."""
    return BALLOON_DEVICES if balloon else DEVICES


#: Every device layout a capture may have been taken with, oldest first: a restore takes
#: the snapshot's own (`runtime.compat`), whatever this node boots with now.
LAYOUTS: tuple[tuple[str, ...], ...] = (BASE_DEVICES, DEVICES, BALLOON_DEVICES)
#: The size of every volume slot and of every volume's image (sparse: holes cost nothing).
#: One size for all, so the guest's idea of a slot's size never changes across restores.
VOLUME_BYTES = 64 << 30
#: The serial of slot i as the guest sees it (/sys/block/vdX/serial): envd finds a
#: volume's device by it, whatever order the kernel probed the disks in.
VOLUME_SERIAL = "aenv-vol{}"


@dataclass(frozen=True)
class Machine:
    """Everything that shapes guest-visible hardware. A snapshot restores only into an equal one.

    Kept apart from per-VM paths so its fingerprint is stable across VMs.
    """

    qemu_version: str
    accel: Accel
    cpu: str
    vcpus: int
    mem_mib: int
    guest_mac: str
    machine: str = "microvm"
    #: root disk, envd's runtime disk (read-only), network, then the volume slots
    devices: tuple[str, ...] = DEVICES

    @property
    def volume_slots(self) -> int:
        """How many volume slots this machine has (0: captured before volumes existed)."""
        if self.devices[: len(BASE_DEVICES)] != BASE_DEVICES:
            return 0
        return self.devices[len(BASE_DEVICES) :].count("virtio-blk-device")

    @property
    def balloon(self) -> bool:
        """Whether this machine has the free-page-reporting balloon (`BALLOON`)."""
        return BALLOON in self.devices

    def fingerprint(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def mismatch(self, other: Machine) -> list[str]:
        """Human-readable differences (for the refusal message)."""
        mine, theirs = asdict(self), asdict(other)
        return [
            f"{k}: snapshot has {theirs[k]!r}, this node has {mine[k]!r}"
            for k in mine
            if mine[k] != theirs[k]
        ]


@dataclass(frozen=True)
class Boot:
    """A cold boot: kernel + initramfs + command line."""

    kernel: Path
    initrd: Path
    cmdline: str


@dataclass(frozen=True)
class Incoming:
    """A restore: device state written by `migrate`, loaded with `migrate-incoming`.

    `ram_in_stream`: the state also carries guest RAM (it was saved from a VM whose RAM was a
    private mapping — a fork child). QEMU must then accept the RAM pages instead of
    expecting them in the shared memory file (`x-ignore-shared` off)."""

    state: Path
    ram_in_stream: bool = False


@dataclass(frozen=True)
class LaunchSpec:
    """One QEMU process: machine, its files, and whether it boots or restores."""

    vm_id: str
    machine: Machine
    workdir: Path  # qmp socket, console log, pid live here
    mem_file: Path  # guest RAM lives in this file (never streamed through a migration)
    mem_shared: bool  # share=on: writes go to the file; share=off: private copy-on-write
    disk: Path  # qcow2, the VM's writable top layer
    runtime_disk: Path  # envd's runtime (raw ext4), attached read-only to every VM
    start: Boot | Incoming
    netns: str | None = None  # path of a network namespace holding `tap`
    tap: str = "tap0"
    # Host-side caps on the QEMU process; None leaves it uncapped.
    mem_limit_bytes: int | None = None
    cpu_limit: float | None = None
    #: A VM no client waits on yet (a warm pool's): it yields the CPU to every other from
    #: its first moment — its state load included — until `QemuVm.set_background(False)`.
    background: bool = False
    extra_args: tuple[str, ...] = field(default=())
    #: each volume slot's image (None: the slot's placeholder, which reads zeros and drops
    #: writes); as many as the machine has slots, at most
    volumes: tuple[Path | None, ...] = ()
    #: the `ramkeep` shim, preloaded into a balloon VM over a private mapping (`ramkeep.py`)
    ram_keep: Path | None = None

    @property
    def qmp_socket(self) -> Path:
        return self.workdir / "qmp.sock"

    @property
    def console_log(self) -> Path:
        return self.workdir / "console.log"
