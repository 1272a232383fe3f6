from pathlib import Path

import pytest

from workers.node.net import GUEST, EgressPolicy, render_rules, slot_address
from workers.node.net.addressing import slot_capacity


def test_slots_get_distinct_non_overlapping_30s() -> None:
    a, b = slot_address(0), slot_address(1)
    assert (a.host_ip, a.ns_ip) == ("10.213.0.1", "10.213.0.2")
    assert (b.host_ip, b.ns_ip) == ("10.213.0.5", "10.213.0.6")
    assert a.netns != b.netns and a.host_if != b.host_if
    assert len(slot_address(16383).host_if) <= 15  # IFNAMSIZ


def test_slot_index_out_of_range_is_refused() -> None:
    assert slot_capacity("10.213.0.0/16") == 16384
    with pytest.raises(ValueError):
        slot_address(16384)
    with pytest.raises(ValueError):
        slot_address(-1)


def test_default_policy_lets_guest_reach_nothing() -> None:
    rules = render_rules(slot_address(3))
    egress = [r for r in rules.splitlines() if r.startswith("-A FORWARD -i tap0")]
    assert egress == []  # FORWARD policy DROP does the rest
    assert ":FORWARD DROP" in rules and ":INPUT DROP" in rules
    assert f"--to-destination {GUEST.ip}" in rules
    assert "-d 10.213.0.14/32 -p tcp -j DNAT" in rules


def test_internet_policy_still_blocks_private_ranges_and_host() -> None:
    rules = render_rules(
        slot_address(0), EgressPolicy(internet=True), host_addresses=("192.0.2.2",)
    ).splitlines()
    egress = [r for r in rules if r.startswith("-A FORWARD -i tap0")]
    host_drop = egress.index(next(r for r in egress if "192.0.2.2/32" in r))
    assert egress[-1].endswith("-j ACCEPT") and "-d" not in egress[-1]
    for cidr in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"):
        i = egress.index(next(r for r in egress if f"-d {cidr} -j DROP" in r))
        assert i < len(egress) - 1
    assert host_drop == 0


def test_allow_beats_deny_as_in_e2b_but_not_the_nodes_own_addresses() -> None:
    """E2B: allowed entries take precedence over denied ones (`allow=X, deny=0.0.0.0/0` is
    "only X"); the node's addresses stay closed whatever is allowed."""
    rules = render_rules(
        slot_address(0),
        EgressPolicy(internet=True, allow=("10.1.0.0/16",), deny=("0.0.0.0/0",)),
        host_addresses=("10.1.0.1",),
    ).splitlines()
    host = next(i for i, r in enumerate(rules) if "10.1.0.1/32 -j DROP" in r)
    allow = next(i for i, r in enumerate(rules) if "10.1.0.0/16 -j ACCEPT" in r)
    deny = next(i for i, r in enumerate(rules) if "-d 0.0.0.0/0 -j DROP" in r)
    internet = next(i for i, r in enumerate(rules) if r.endswith("-s 169.254.0.21/32 -j ACCEPT"))
    assert host < allow < deny < internet


def test_bad_cidr_is_rejected() -> None:
    with pytest.raises(ValueError, match="invalid CIDR"):
        EgressPolicy(allow=("not-a-net",))


def test_a_sibling_stacks_slot_device_is_recognised_by_its_index_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two stacks on one host share the slot index space: the host end of another stack's
    slot (whatever its prefix) is not a foreign route over our range. CI's CLI stack once
    refused to start beside a developer's stack with prefix `clipm`."""
    from workers.node.net import slot

    monkeypatch.setattr(slot, "LOCK_DIR", tmp_path)
    (tmp_path / "3.lock").write_text("clipm")
    assert slot.is_slot_device("clipmh3")
    assert not slot.is_slot_device("clipmh4")  # no lock for index 4
    assert not slot.is_slot_device("otherh3")  # index 3 is clipm's
    assert not slot.is_slot_device("eth0")
    assert not slot.is_slot_device("docker0")
