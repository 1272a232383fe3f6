"""The lease aggregate (`domain/lease.py`): opened with a TTL in range, renewed while it
is live, expired by the timer only once its deadline passed (a renewal that came first
wins), ended by its client; what its end does to its sandboxes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from domain import CommandRejected, Conflict, CorruptHistory, Invalid, NotFound
from domain import lease as ls
from domain import node as nd

T0 = datetime(2026, 12, 7, 4, 0, tzinfo=UTC)


def _at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def _run(
    state: ls.Lease | None, *commands: ls.AnyLeaseCommand
) -> tuple[ls.Lease | None, list[str]]:
    names: list[str] = []
    for c in commands:
        events = ls.decide_lease(state, c)
        names += [type(e).__name__ for e in events]
        state = ls.fold_lease(events, state)
    return state, names


def _open(ttl: float = 10, on_expiry: ls.OnExpiry = "kill") -> ls.Lease:
    state, _ = _run(
        None, ls.OpenLease(lease_id="l1", team_id="t", ttl_s=ttl, on_expiry=on_expiry, at=T0)
    )
    assert state is not None
    return state


def test_open_sets_the_deadline_ttl_from_now() -> None:
    lease = _open(10, "pause")
    assert lease.status is ls.LeaseStatus.ACTIVE
    assert (lease.expires_at, lease.opened_at, lease.on_expiry, lease.team_id) == (
        _at(10),
        T0,
        "pause",
        "t",
    )
    assert ls.member_action(lease) is None


@pytest.mark.parametrize("ttl", [0, 0.5, -1, ls.MAX_TTL_S + 1])
def test_a_ttl_out_of_range_is_invalid(ttl: float) -> None:
    with pytest.raises(Invalid, match="out of range"):
        ls.decide_lease(None, ls.OpenLease(lease_id="l1", team_id="t", ttl_s=ttl))
    with pytest.raises(Invalid):
        ls.decide_lease(_open(), ls.RenewLease(lease_id="l1", ttl_s=ttl, at=_at(1)))


def test_opening_an_existing_lease_conflicts() -> None:
    with pytest.raises(Conflict):
        ls.decide_lease(_open(), ls.OpenLease(lease_id="l1", team_id="t", ttl_s=5))


def test_renew_pushes_the_deadline_with_its_own_or_a_new_ttl() -> None:
    state, names = _run(_open(10), ls.RenewLease(lease_id="l1", at=_at(8)))
    assert names == ["LeaseRenewed"] and state is not None and state.expires_at == _at(18)
    state, _ = _run(state, ls.RenewLease(lease_id="l1", ttl_s=30, at=_at(9)))
    assert state is not None and (state.expires_at, state.ttl_s) == (_at(39), 30)


def test_an_expiry_before_the_deadline_decides_nothing() -> None:
    assert ls.decide_lease(_open(10), ls.ExpireLease(lease_id="l1", at=_at(9.9))) == []


def test_a_renewal_that_came_first_wins_over_an_expiry_seen_on_an_older_state() -> None:
    renewed, _ = _run(_open(10), ls.RenewLease(lease_id="l1", at=_at(9)))
    assert ls.decide_lease(renewed, ls.ExpireLease(lease_id="l1", at=_at(10.5))) == []


def test_the_deadline_passed_expires_it_and_its_sandboxes_get_its_action() -> None:
    for on_expiry in ("kill", "pause"):
        state, names = _run(_open(10, on_expiry), ls.ExpireLease(lease_id="l1", at=_at(10)))
        assert names == ["LeaseExpired"] and state is not None
        assert (state.status, state.ended_at) == (ls.LeaseStatus.EXPIRED, _at(10))
        assert ls.member_action(state) == on_expiry
        # a second timer, or the same one again: nothing more
        assert ls.decide_lease(state, ls.ExpireLease(lease_id="l1", at=_at(11))) == []


def test_a_renewal_past_the_deadline_is_refused_even_before_the_timer_acted() -> None:
    with pytest.raises(Conflict, match="expired"):
        ls.decide_lease(_open(10), ls.RenewLease(lease_id="l1", at=_at(10)))
    expired, _ = _run(_open(10), ls.ExpireLease(lease_id="l1", at=_at(11)))
    with pytest.raises(Conflict, match="expired"):
        ls.decide_lease(expired, ls.RenewLease(lease_id="l1", at=_at(12)))


def test_end_kills_whatever_the_expiry_action_and_is_idempotent() -> None:
    state, names = _run(_open(10, "pause"), ls.EndLease(lease_id="l1", at=_at(3)))
    assert names == ["LeaseEnded"] and state is not None
    assert (state.status, state.ended_at, ls.member_action(state)) == (
        ls.LeaseStatus.ENDED,
        _at(3),
        "kill",
    )
    assert ls.decide_lease(state, ls.EndLease(lease_id="l1", at=_at(4))) == []
    with pytest.raises(Conflict):
        ls.decide_lease(state, ls.RenewLease(lease_id="l1", at=_at(4)))


def test_ending_an_expired_lease_kills_its_paused_sandboxes_from_then_on() -> None:
    state, names = _run(
        _open(10, "pause"),
        ls.ExpireLease(lease_id="l1", at=_at(10)),
        ls.EndLease(lease_id="l1", at=_at(50)),
    )
    assert names == ["LeaseExpired", "LeaseEnded"] and state is not None
    assert (state.ended_at, ls.member_action(state)) == (_at(50), "kill")


def test_commands_on_no_lease_are_not_found() -> None:
    for cmd in (
        ls.RenewLease(lease_id="x"),
        ls.ExpireLease(lease_id="x"),
        ls.EndLease(lease_id="x"),
    ):
        with pytest.raises(NotFound):
            ls.decide_lease(None, cmd)


def test_evolve_ignores_rejections_and_refuses_foreign_or_orphan_events() -> None:
    lease = _open()
    rejected = CommandRejected(
        aggregate_id="l1",
        command_id=ls.RenewLease(lease_id="l1").command_id,
        command_type="RenewLease",
        code="conflict",
        reason="expired",
        at=T0,
    )
    assert ls.evolve_lease(lease, rejected) is lease
    with pytest.raises(CorruptHistory):
        ls.evolve_lease(None, ls.LeaseRenewed(lease_id="l1", ttl_s=1, expires_at=T0, at=T0))
    with pytest.raises(CorruptHistory):
        ls.evolve_lease(lease, nd.NodeCordoned(node_id="n1", at=T0))
