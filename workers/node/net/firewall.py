"""Pure rendering of a slot's iptables ruleset (applied atomically with iptables-restore).

Default: the host reaches any TCP port of the guest (DNAT from the veth), the guest reaches
nothing — not the host, not other sandboxes, not private ranges, not the internet. An
`EgressPolicy` opens specific CIDRs; private and host ranges stay closed unless named
explicitly in `allow`.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from workers.node.net.addressing import GUEST, GuestAddressing, SlotAddress

# Ranges a guest must never reach unless an operator allows them by name: RFC 1918, CGNAT,
# loopback, link-local (cloud metadata lives there), TEST-NETs, multicast and reserved.
BLOCKED_BY_DEFAULT: tuple[str, ...] = (
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "224.0.0.0/4",
    "240.0.0.0/4",
)


@dataclass(frozen=True)
class EgressPolicy:
    """What a guest may dial. `internet` opens public addresses; `allow`/`deny` are CIDRs.

    Precedence (E2B's: "allowed entries always take precedence over denied entries", so
    `allow=X, deny=0.0.0.0/0` means "only X"): the node's own addresses (never) > allow >
    deny > default-blocked ranges > internet flag.
    """

    internet: bool = False
    allow: tuple[str, ...] = field(default=())
    deny: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        for cidr in (*self.allow, *self.deny):
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError as e:
                raise ValueError(f"invalid CIDR in egress policy: {cidr!r}") from e


def render_rules(
    slot: SlotAddress,
    policy: EgressPolicy = EgressPolicy(),
    guest: GuestAddressing = GUEST,
    host_addresses: tuple[str, ...] = (),
) -> str:
    """iptables-restore input for the slot's netns (filter + nat tables)."""
    tap, veth, g = guest.tap_name, slot.ns_if, guest.ip
    filt = [
        "*filter",
        ":INPUT DROP [0:0]",
        ":FORWARD DROP [0:0]",
        ":OUTPUT ACCEPT [0:0]",
        "-A INPUT -i lo -j ACCEPT",
        "-A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
        "-A FORWARD -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
        # host -> guest: only connections the PREROUTING DNAT below rewrote
        f"-A FORWARD -i {veth} -o {tap} -d {g}/32 -m conntrack --ctstate DNAT -j ACCEPT",
    ]
    egress = f"-A FORWARD -i {tap} -o {veth} -s {g}/32"
    for addr in host_addresses:  # the node's own addresses: never reachable, even if allowed
        filt.append(f"{egress} -d {_net(addr)} -j DROP")
    for cidr in policy.allow:
        filt.append(f"{egress} -d {_net(cidr)} -j ACCEPT")
    for cidr in policy.deny:
        filt.append(f"{egress} -d {_net(cidr)} -j DROP")
    if policy.internet:
        for cidr in BLOCKED_BY_DEFAULT:
            filt.append(f"{egress} -d {cidr} -j DROP")
        filt.append(f"{egress} -j ACCEPT")
    filt.append("COMMIT")
    nat = [
        "*nat",
        ":PREROUTING ACCEPT [0:0]",
        ":INPUT ACCEPT [0:0]",
        ":OUTPUT ACCEPT [0:0]",
        ":POSTROUTING ACCEPT [0:0]",
        f"-A PREROUTING -i {veth} -d {slot.ns_ip}/32 -p tcp -j DNAT --to-destination {g}",
        f"-A POSTROUTING -o {veth} -s {g}/32 -j MASQUERADE",
        "COMMIT",
    ]
    return "\n".join([*filt, *nat]) + "\n"


def _net(cidr: str) -> str:
    return str(ipaddress.ip_network(cidr, strict=False))
