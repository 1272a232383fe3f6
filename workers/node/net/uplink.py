"""Host-side egress for guests a policy lets out: forwarding + NAT in the root namespace.

A slot's own firewall decides *what* its guest may dial (`firewall.render_rules`) and
masquerades it to the slot's veth address; this module makes the host carry what passed
that filter onwards, masqueraded again to the host's outgoing address, and nothing else:
slot-to-slot traffic is dropped here too (defence in depth: each slot already drops
private ranges), and the host's own services are refused inside the slot. Off by default
(`AENV_EGRESS_ENABLED`): it turns on IPv4 forwarding for the host.

Rules live in chains of our own (`AENV-<PREFIX>-FWD`, `AENV-<PREFIX>-NAT`), replaced as a
whole with `iptables-restore --noflush`, and one jump each from FORWARD / POSTROUTING; so
several stacks on one host (prefixes) never touch each other's rules and `disable` removes
exactly what `enable` added.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from workers.node.net.errors import NetworkError

IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")


@dataclass(frozen=True)
class Uplink:
    """The host-side egress of one stack's slots (`prefix`, `slot_cidr`)."""

    prefix: str
    slot_cidr: str

    @property
    def fwd_chain(self) -> str:
        return f"AENV-{self.prefix.upper()}-FWD"

    @property
    def nat_chain(self) -> str:
        return f"AENV-{self.prefix.upper()}-NAT"

    def rules(self) -> str:
        """iptables-restore --noflush input: (re)defines our two chains only."""
        veths = f"{self.prefix}h+"  # host ends of this stack's slots (slot.slot_address)
        return "\n".join(
            [
                "*filter",
                f":{self.fwd_chain} - [0:0]",
                f"-A {self.fwd_chain} -o {veths} -m conntrack --ctstate ESTABLISHED,RELATED "
                "-j ACCEPT",
                f"-A {self.fwd_chain} -i {veths} -o {veths} -j DROP",
                f"-A {self.fwd_chain} -i {veths} -s {self.slot_cidr} -j ACCEPT",
                f"-A {self.fwd_chain} -i {veths} -j DROP",
                "COMMIT",
                "*nat",
                f":{self.nat_chain} - [0:0]",
                f"-A {self.nat_chain} -s {self.slot_cidr} ! -o {veths} -j MASQUERADE",
                "COMMIT",
                "",
            ]
        )

    def jumps(self) -> list[tuple[str, str, str]]:
        """(table, built-in chain, our chain) pairs hooked in at position 1."""
        return [("filter", "FORWARD", self.fwd_chain), ("nat", "POSTROUTING", self.nat_chain)]


def enable(uplink: Uplink) -> None:
    """Install (or refresh) the chains and jumps, then turn on IPv4 forwarding."""
    _run(["iptables-restore", "-w", "--noflush"], uplink.rules())
    for table, chain, ours in uplink.jumps():
        if not _ok(["iptables", "-w", "-t", table, "-C", chain, "-j", ours]):
            _run(["iptables", "-w", "-t", table, "-I", chain, "1", "-j", ours])
    try:
        IP_FORWARD.write_text("1\n")
    except OSError as e:
        raise NetworkError(f"cannot enable IPv4 forwarding for guest egress: {e}") from e


def disable(uplink: Uplink) -> None:
    """Remove the jumps and our chains (forwarding stays as it is: others may rely on it)."""
    for table, chain, ours in uplink.jumps():
        while _ok(["iptables", "-w", "-t", table, "-D", chain, "-j", ours]):
            pass
        _ok(["iptables", "-w", "-t", table, "-F", ours])
        _ok(["iptables", "-w", "-t", table, "-X", ours])


def _ok(argv: list[str]) -> bool:
    return subprocess.run(argv, capture_output=True, timeout=10, check=False).returncode == 0


def _run(argv: list[str], stdin: str | None = None) -> None:
    proc = subprocess.run(
        argv,
        input=stdin.encode() if stdin else None,
        capture_output=True,
        timeout=10,
        check=False,
    )
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip()
        raise NetworkError(f"{' '.join(argv[:3])} failed: {err}")
