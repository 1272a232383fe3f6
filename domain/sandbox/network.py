"""A sandbox's egress rules: what an entry may be, and the decision to replace them.

E2B's `PUT /sandboxes/{id}/network` replaces the whole egress configuration of a running
sandbox at once (fields left out are cleared); `allowPublicTraffic` is ingress and stays
what the create made it (its traffic token goes with it). aenv enforces egress with
iptables on IPv4 addresses, so an entry is an IPv4 address or CIDR: a domain name (E2B
allows them in `allowOut`, filtered by SNI/DNS) is refused rather than silently not
enforced, the same for a create and an update.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from domain.errors import Conflict, Invalid
from domain.sandbox.commands import UpdateSandboxNetwork
from domain.sandbox.events import SandboxEvent, SandboxNetworkUpdated
from domain.sandbox.state import Sandbox
from domain.sandbox.values import SandboxStatus

__all__ = ["MAX_EGRESS_ENTRIES", "check_egress", "update_network"]

#: Entries per list: each is one iptables rule in the sandbox's namespace, applied in one
#: `iptables-restore`; E2B documents no cap, a few hundred keeps a rule set cheap to swap.
MAX_EGRESS_ENTRIES = 256

S = SandboxStatus
#: The VM runs (a snapshot or fork of it runs on), so its firewall can be swapped now.
_LIVE = frozenset({S.RUNNING, S.SNAPSHOTTING, S.FORKING})


def _check_entry(field: str, entry: str) -> None:
    try:
        ipaddress.IPv4Network(entry, strict=False)
    except ValueError:
        raise Invalid(
            f"invalid {field} entry {entry!r}: an IPv4 address or CIDR block is expected "
            "(domain names and IPv6 are not supported by aenv's egress firewall)"
        ) from None


def check_egress(allow_out: Sequence[str], deny_out: Sequence[str]) -> None:
    """Raise `Invalid` unless every entry of both lists is an IPv4 address or CIDR."""
    for field, entries in (("allowOut", allow_out), ("denyOut", deny_out)):
        if len(entries) > MAX_EGRESS_ENTRIES:
            raise Invalid(f"{field} has {len(entries)} entries; at most {MAX_EGRESS_ENTRIES}")
        for entry in entries:
            _check_entry(field, entry)


def update_network(s: Sandbox, c: UpdateSandboxNetwork) -> list[SandboxEvent]:
    """Replace a live sandbox's egress rules. A paused (or pausing, resuming, …) one is a
    conflict: E2B's orchestrator answers 409 for a sandbox that is not running."""
    check_egress(c.allow_out, c.deny_out)
    if s.status not in _LIVE:
        raise Conflict(f"cannot update the network of a sandbox that is {s.status}")
    return [
        SandboxNetworkUpdated(
            sandbox_id=s.sandbox_id,
            at=c.at,
            command_id=c.command_id,
            allow_internet_access=c.allow_internet_access,
            allow_out=c.allow_out,
            deny_out=c.deny_out,
        )
    ]
