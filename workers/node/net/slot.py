"""Create and destroy one network slot (netns + veth pair + tap + firewall) with pyroute2.

Blocking netlink work; callers on an event loop run it via `asyncio.to_thread`. The only
exec is one `nsenter … iptables-restore` per slot, because there is no netlink API for
xtables rulesets and nftables-over-netlink would be a second firewall dialect to maintain.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from pyroute2 import IPRoute, NetNS, netns
from pyroute2.netlink.exceptions import NetlinkError

from workers.node.net.addressing import (
    DEFAULT_SLOT_CIDR,
    GUEST,
    GuestAddressing,
    SlotAddress,
    slot_address,
)
from workers.node.net.errors import NetworkError
from workers.node.net.firewall import EgressPolicy, render_rules
from workers.node.net.forksafe import install as _install_forksafe

_install_forksafe()

NETNS_DIR = Path("/run/netns")
LOCK_DIR = Path(os.environ.get("AENV_RUN_DIR", "/run/aenv")) / "slots"


@dataclass
class NetworkSlot:
    """A ready slot. Owned by exactly one process, proven by an flock on its lock file."""

    address: SlotAddress
    guest: GuestAddressing = GUEST
    policy: EgressPolicy = field(default_factory=EgressPolicy)
    lock_fd: int | None = None

    @property
    def netns_path(self) -> str:
        return str(NETNS_DIR / self.address.netns)

    @property
    def host_reachable_ip(self) -> str:
        """Where the node dials the guest: the netns end of the veth, DNATed to the guest."""
        return self.address.ns_ip


def try_lock(index: int, owner: str | None = None) -> int | None:
    """Claim slot `index` for this process; None if another live process holds it. Every
    stack on the host shares the index space (an index is an address, and stacks may share
    a range), so the lock file says which slot prefix holds it (`owner`)."""
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(LOCK_DIR / f"{index}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    if owner is not None:
        os.ftruncate(fd, 0)
        os.pwrite(fd, owner.encode(), 0)
    return fd


def _lock_owner(index: int) -> str:
    try:
        return (LOCK_DIR / f"{index}.lock").read_text()
    except OSError:
        return ""


def create_slot(
    address: SlotAddress,
    *,
    lock_fd: int | None,
    policy: EgressPolicy | None = None,
    guest: GuestAddressing = GUEST,
    host_addresses: tuple[str, ...] = (),
) -> NetworkSlot:
    """Build the slot from scratch (removing a stale one left by a crashed owner first)."""
    policy = policy or EgressPolicy()
    _remove(address)  # a previous owner may have died mid-life; its lock died with it
    try:
        netns.create(address.netns)
        with IPRoute() as ipr:
            ipr.link(
                "add",
                ifname=address.host_if,
                kind="veth",
                peer={"ifname": address.ns_if, "net_ns_fd": address.netns},
            )
            idx = ipr.link_lookup(ifname=address.host_if)[0]
            ipr.addr("add", index=idx, address=address.host_ip, prefixlen=address.prefixlen)
            ipr.link("set", index=idx, state="up")
        with NetNS(address.netns) as ns:
            ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")
            v = ns.link_lookup(ifname=address.ns_if)[0]
            ns.addr("add", index=v, address=address.ns_ip, prefixlen=address.prefixlen)
            ns.link("set", index=v, state="up")
            ns.link("add", ifname=guest.tap_name, kind="tuntap", mode="tap")
            t = ns.link_lookup(ifname=guest.tap_name)[0]
            ns.link("set", index=t, address=guest.tap_mac, state="up")
            ns.addr("add", index=t, address=guest.gateway, prefixlen=guest.prefixlen)
            ns.route("add", dst="0.0.0.0/0", gateway=address.host_ip)
        _apply_firewall(address, render_rules(address, policy, guest, host_addresses))
    except (NetlinkError, OSError, subprocess.SubprocessError) as e:
        _remove(address)
        raise NetworkError(f"creating network slot {address.netns} failed: {e}") from e
    return NetworkSlot(address=address, guest=guest, policy=policy, lock_fd=lock_fd)


def update_policy(
    slot: NetworkSlot, policy: EgressPolicy, host_addresses: tuple[str, ...] = ()
) -> None:
    """Swap the slot's egress policy atomically (iptables-restore replaces whole tables)."""
    _apply_firewall(slot.address, render_rules(slot.address, policy, slot.guest, host_addresses))
    slot.policy = policy


def destroy_slot(slot: NetworkSlot) -> None:
    """Remove everything the slot created and release its claim. Idempotent."""
    _remove(slot.address)
    if slot.lock_fd is not None:
        with contextlib.suppress(OSError):
            os.close(slot.lock_fd)
        slot.lock_fd = None


def list_leftovers(prefix: str = "aenv") -> list[str]:
    """Namespaces named like ours that exist right now (for leak checks and reconciliation)."""
    return sorted(n for n in netns.listnetns() if n.startswith(f"{prefix}-"))


def sweep_stale(prefix: str, cidr: str) -> int:
    """Remove this prefix's slots whose owner is dead (its flock died with it): a node that
    was SIGKILLed leaves its warm slots behind, and nobody else would claim those indices.
    Returns how many were removed."""
    removed = 0
    for name in list_leftovers(prefix):
        suffix = name.removeprefix(f"{prefix}-")
        if not suffix.isdigit():
            continue
        fd = try_lock(int(suffix))
        if fd is None and _lock_owner(int(suffix)) == prefix:
            continue  # a live process of this prefix owns it
        # (held by another prefix's stack: that one took the index since ours died)
        try:
            destroy_slot(NetworkSlot(address=slot_address(int(suffix), cidr, prefix), lock_fd=fd))
            removed += 1
        except (ValueError, OSError):
            if fd is not None:
                os.close(fd)
    return removed


def host_addresses() -> tuple[str, ...]:
    """Every IPv4 address of the root namespace: guests may never dial these."""
    with IPRoute() as ipr:
        return tuple(
            str(a.get_attr("IFA_ADDRESS"))
            for a in ipr.get_addr(family=2)
            if a.get_attr("IFA_ADDRESS")
        )


_SLOT_DEVICE = re.compile(r"^([a-z]{1,8})h(\d+)$")


def is_slot_device(dev: str) -> bool:
    """Whether `dev` is the host end of some aenv stack's slot (`<prefix>h<index>` whose
    index lock names that prefix), whatever its prefix: stacks share the index space, so
    a sibling's slot never overlaps one of ours."""
    m = _SLOT_DEVICE.match(dev)
    return m is not None and _lock_owner(int(m.group(2))) == m.group(1)


def routed_overlap(cidr: str = DEFAULT_SLOT_CIDR, prefix: str = "aenv") -> list[str]:
    """Routes of the host (not ours: this prefix's slots, or a sibling aenv stack's) that
    overlap the slot range: starting over them is unsafe."""
    ours = ipaddress.ip_network(cidr)
    hits: list[str] = []
    with IPRoute() as ipr:
        # routes first, then the links: a link another stack removed in between (its slot
        # torn down) leaves a route to no device, which is nobody's — it was named "" and
        # taken for a foreign route over the range
        routes = ipr.get_routes(family=2)
        names = {link["index"]: link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
        for r in routes:
            dst, oif = r.get_attr("RTA_DST"), r.get_attr("RTA_OIF")
            if dst is None or (oif is not None and oif not in names):
                continue
            net = ipaddress.ip_network(f"{dst}/{r['dst_len']}", strict=False)
            dev = str(names.get(oif, ""))  # no device at all: a blackhole, say — foreign
            if net.overlaps(ours) and not (dev.startswith(("aenv", prefix)) or is_slot_device(dev)):
                hits.append(f"{net} dev {dev}")
    return hits


def _apply_firewall(address: SlotAddress, rules: str) -> None:
    script = (
        "echo 1 > /proc/sys/net/ipv4/ip_forward && "
        "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6 && "
        "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6 && "
        "exec iptables-restore"
    )
    proc = subprocess.run(
        ["nsenter", f"--net={NETNS_DIR / address.netns}", "/bin/sh", "-c", script],
        input=rules.encode(),
        capture_output=True,
        timeout=10,
        check=False,
    )
    if proc.returncode != 0:
        raise NetworkError(
            f"firewall of {address.netns} rejected: {proc.stderr.decode(errors='replace').strip()}"
        )


def _remove(address: SlotAddress) -> None:
    """Remove whatever occupies this slot: ours by name, and any stale slot of the same
    index left by a killed process of any aenv stack (same /30, other prefix). Holding the
    index's lock is what makes everything found here stale."""
    with IPRoute() as ipr:
        doomed = set(ipr.link_lookup(ifname=address.host_if))
        for a in ipr.get_addr(family=2, address=address.host_ip):
            doomed.add(a["index"])
        for idx in doomed:
            with contextlib.suppress(NetlinkError):
                ipr.link("del", index=idx)
    suffix = f"-{address.index}"
    for name in netns.listnetns():
        if name == address.netns or (name.startswith("aenv") and name.endswith(suffix)):
            with contextlib.suppress(OSError):
                netns.remove(name)
