"""Pure address arithmetic for network slots.

The guest side is identical in every slot (fixed IP and MAC, so a snapshot taken in one
slot restores into any other); only the host-side /30 differs per slot.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass


@dataclass(frozen=True)
class GuestAddressing:
    """What the guest sees. Baked into the template snapshot: never change for live images."""

    ip: str = "169.254.0.21"
    gateway: str = "169.254.0.22"  # the tap inside the slot's netns
    prefixlen: int = 30
    guest_mac: str = "06:00:ac:10:00:02"
    tap_mac: str = "06:00:ac:10:00:01"  # fixed so a restored guest's ARP cache stays valid
    tap_name: str = "tap0"

    @property
    def cidr(self) -> str:
        return f"{self.ip}/{self.prefixlen}"


GUEST = GuestAddressing()

# 10.213.0.0/16 gives 16384 /30 slots. Overridable (AENV_SLOT_CIDR) for hosts whose own
# networks overlap it; the pool refuses to start if the range is routed elsewhere.
DEFAULT_SLOT_CIDR = "10.213.0.0/16"


@dataclass(frozen=True)
class SlotAddress:
    """Host-visible addressing of one slot: names and the veth /30."""

    index: int
    netns: str
    host_if: str
    ns_if: str
    host_ip: str
    ns_ip: str  # the address the host dials; DNAT inside the netns forwards it to the guest
    prefixlen: int = 30


def slot_capacity(cidr: str = DEFAULT_SLOT_CIDR) -> int:
    net = ipaddress.ip_network(cidr)
    return int(net.num_addresses // 4)


def slot_address(index: int, cidr: str = DEFAULT_SLOT_CIDR, prefix: str = "aenv") -> SlotAddress:
    """Address slot `index` of `cidr`; raises ValueError outside the range."""
    net = ipaddress.ip_network(cidr)
    if not 0 <= index < slot_capacity(cidr):
        raise ValueError(f"slot index {index} outside {cidr} (capacity {slot_capacity(cidr)})")
    base = int(net.network_address) + 4 * index
    return SlotAddress(
        index=index,
        netns=f"{prefix}-{index}",
        host_if=f"{prefix}h{index}"[:15],
        ns_if="veth0",
        host_ip=str(ipaddress.ip_address(base + 1)),
        ns_ip=str(ipaddress.ip_address(base + 2)),
    )
