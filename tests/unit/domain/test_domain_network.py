"""Replacing a sandbox's egress rules (E2B `update_network`): what `decide` accepts and
refuses, and what the fold keeps across a pause and a resume."""

from __future__ import annotations

import pytest

from domain import Conflict, Invalid
from domain import sandbox as sb
from tests.unit.domain.builders import SID, at, create, paused, running, step


def update(**kw: object) -> sb.UpdateSandboxNetwork:
    fields: dict[str, object] = {"sandbox_id": SID, "at": at(5)}
    fields.update(kw)
    return sb.UpdateSandboxNetwork.model_validate(fields)


def test_an_update_replaces_every_egress_field_and_keeps_ingress() -> None:
    before = running(
        network=sb.NetworkPolicy(
            allow_internet_access=False, allow_public_traffic=False, allow_out=("1.1.1.1",)
        ),
        traffic_access_token="t",
    )
    cmd = update(deny_out=("0.0.0.0/0",))
    [event] = sb.decide(before, cmd)
    assert isinstance(event, sb.SandboxNetworkUpdated)
    assert event.command_id == cmd.command_id
    after = sb.fold([event], before)
    assert after is not None
    # allowOut left out is cleared, allow_internet_access back to its default; ingress
    # (allowPublicTraffic and its token) is not part of an update
    assert after.network == sb.NetworkPolicy(
        allow_internet_access=True, allow_public_traffic=False, deny_out=("0.0.0.0/0",)
    )
    assert after.traffic_access_token == "t"
    assert after.status is sb.SandboxStatus.RUNNING


def test_a_redelivered_update_decides_nothing() -> None:
    cmd = update(allow_out=("198.51.100.0/24",))
    s = step(running(), cmd)
    assert sb.decide(s, cmd) == []


def test_the_rules_hold_across_pause_and_resume() -> None:
    s = step(running(), update(allow_internet_access=False, allow_out=("10.0.0.7",)))
    s = step(s, sb.PauseSandbox(sandbox_id=SID, at=at(10)))
    s = step(s, sb.CompletePause(sandbox_id=SID, at=at(11), snapshot_id="p1"))
    s = step(s, sb.ResumeSandbox(sandbox_id=SID, at=at(20)))
    s = step(s, sb.CompleteResume(sandbox_id=SID, at=at(21), node_id="n2"))
    assert s is not None and s.status is sb.SandboxStatus.RUNNING
    assert s.network.allow_out == ("10.0.0.7",)
    assert s.network.allow_internet_access is False
    # what a resume (here or on another node) restores from: the spec
    assert s.spec.network == s.network


def test_a_paused_sandbox_is_a_conflict() -> None:
    with pytest.raises(Conflict, match="paused"):
        sb.decide(paused(), update())


@pytest.mark.parametrize(
    ("field", "entry"),
    [
        ("allow_out", "example.com"),
        ("allow_out", "*.example.com"),
        ("deny_out", "10.0.0.0/33"),
        ("deny_out", "300.1.1.1"),
        ("allow_out", "2001:db8::/32"),
        ("allow_out", "1.2.3.4:443"),
        ("deny_out", ""),
    ],
)
def test_an_entry_that_is_not_an_ipv4_address_or_cidr_is_invalid(field: str, entry: str) -> None:
    with pytest.raises(Invalid, match="IPv4 address or CIDR"):
        sb.decide(running(), update(**{field: (entry,)}))


@pytest.mark.parametrize("entry", ["8.8.8.8", "8.8.8.8/32", "10.1.2.3/16", "0.0.0.0/0"])
def test_addresses_and_cidrs_are_valid(entry: str) -> None:
    assert sb.decide(running(), update(allow_out=(entry,), deny_out=(entry,)))


def test_too_many_entries_are_invalid() -> None:
    many = tuple(f"10.0.{i // 256}.{i % 256}" for i in range(sb.MAX_EGRESS_ENTRIES + 1))
    with pytest.raises(Invalid, match="at most"):
        sb.decide(running(), update(deny_out=many))


def test_a_create_checks_its_rules_alike() -> None:
    with pytest.raises(Invalid, match="IPv4 address or CIDR"):
        sb.decide(None, create(network=sb.NetworkPolicy(allow_out=("example.com",))))
