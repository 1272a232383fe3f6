"""The kernel command line: the boot contract between the node's VMM driver and the guest.

Every guest has the same fixed address (so snapshots restore anywhere): 169.254.0.21/30
on eth0 with MAC 06:00:ac:10:00:02, gateway 169.254.0.22 (the tap in the VM's netns).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

GUEST_IP = "169.254.0.21/30"
GUEST_GW = "169.254.0.22"
GUEST_MAC = "06:00:ac:10:00:02"

# Host-independent part stored in the image manifest. `tsc_early_khz` is added per host
# (without it ~60 % of TCG boots hang calibrating the TSC); `cryptomgr.notests` skips
# ~0.3 s of crypto self-tests; `panic=-1` + QEMU `-no-reboot` make a dead guest exit QEMU.
CMDLINE_BASE = "console=ttyS0 quiet panic=-1 tsc=reliable cryptomgr.notests vmroot=ext4"


def parse_cpu_khz(cpuinfo: str) -> int:
    """kHz of the first `cpu MHz` line of /proc/cpuinfo (the TSC rate on our hosts)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "cpu MHz":
            return round(float(value.strip()) * 1000)
    raise ValueError("no 'cpu MHz' line in /proc/cpuinfo")


def tsc_khz(cpuinfo: Path = Path("/proc/cpuinfo")) -> int:
    """This host's TSC frequency in kHz, for `tsc_early_khz=`."""
    return parse_cpu_khz(cpuinfo.read_text())


class HasCmdlineBase(Protocol):
    """Anything carrying a host-independent command line (a `GuestImage`)."""

    @property
    def kernel_cmdline_base(self) -> str: ...


def kernel_cmdline(
    image: HasCmdlineBase | str = CMDLINE_BASE,
    *,
    ip: str | None = GUEST_IP,
    gw: str | None = GUEST_GW,
    debug: bool = False,
    khz: int | None = None,
    extra: dict[str, str] | None = None,
) -> str:
    """A full command line: the image's base with `tsc_early_khz` after `panic=`, then knobs.

    `image` is a `GuestImage` (or a base string); `ip=None` boots without network setup
    (the initramfs fails the boot if `vmip` is given but no eth0 exists).
    """
    base = image if isinstance(image, str) else image.kernel_cmdline_base
    tokens = base.split()
    tsc = f"tsc_early_khz={khz if khz is not None else tsc_khz()}"
    at = next((i + 1 for i, t in enumerate(tokens) if t.startswith("panic=")), len(tokens))
    tokens.insert(at, tsc)
    if ip:
        tokens.append(f"vmip={ip}")
        if gw:
            tokens.append(f"vmgw={gw}")
    if debug:
        tokens.append("vmdebug=1")
    for key, value in (extra or {}).items():
        if not key or any(c.isspace() for c in key + value):
            raise ValueError(f"bad kernel parameter {key}={value!r}")
        tokens.append(f"{key}={value}")
    return " ".join(tokens)
