"""The host-side egress ruleset (pure rendering; applying it is tested with real VMs)."""

from __future__ import annotations

from workers.node.net.uplink import Uplink


def test_chains_are_per_stack_and_only_slot_traffic_is_forwarded() -> None:
    up = Uplink("aenve", "10.213.0.0/16")
    rules = up.rules()
    assert up.fwd_chain == "AENV-AENVE-FWD" and up.nat_chain == "AENV-AENVE-NAT"
    lines = rules.splitlines()
    fwd = [ln for ln in lines if ln.startswith(f"-A {up.fwd_chain}")]
    # replies first, then slot-to-slot dropped before slot traffic is accepted, then drop
    assert "ESTABLISHED,RELATED" in fwd[0] and "-o aenveh+" in fwd[0]
    assert fwd[1] == "-A AENV-AENVE-FWD -i aenveh+ -o aenveh+ -j DROP"
    assert fwd[2] == "-A AENV-AENVE-FWD -i aenveh+ -s 10.213.0.0/16 -j ACCEPT"
    assert fwd[3] == "-A AENV-AENVE-FWD -i aenveh+ -j DROP"
    assert "-A AENV-AENVE-NAT -s 10.213.0.0/16 ! -o aenveh+ -j MASQUERADE" in lines
    # --noflush input: it declares only our chains, never a built-in one's policy
    assert not any(ln.startswith((":FORWARD", ":POSTROUTING", ":INPUT")) for ln in lines)
    assert up.jumps() == [("filter", "FORWARD", up.fwd_chain), ("nat", "POSTROUTING", up.nat_chain)]
