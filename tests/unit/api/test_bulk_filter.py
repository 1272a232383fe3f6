"""Bulk actions by metadata (`api/bulk.py`, `bus/bulk.py`), the pure parts: which filters a
request may give (an empty one only as `all: true`), which sandboxes an action applies to,
and the ids of their commands — the same for a repeated sweep, new once a sandbox moved on,
distinct for a lease's expiry and its later end."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from api.bulk import BulkBody, BulkResult, bulk_filter
from api.errors import ApiError
from bus.bulk import Member, acted_on, end_command
from domain import lease as ls
from domain import sandbox as sb
from workers.timer.leases import expire_command, sweep_tag

S = sb.SandboxStatus
T = datetime(2026, 12, 7, 4, 0, tzinfo=UTC)


def test_a_filter_is_needed_unless_all_is_said() -> None:
    assert bulk_filter(BulkBody(metadata={"job": "j1"})) == {"job": "j1"}
    assert bulk_filter(BulkBody(all=True)) is None
    for body in (BulkBody(), BulkBody(metadata={}), BulkBody(all=False)):
        with pytest.raises(ApiError) as refused:
            bulk_filter(body)
        assert refused.value.status == 400 and "all" in refused.value.message
    with pytest.raises(ApiError) as both:
        bulk_filter(BulkBody(all=True, metadata={"a": "b"}))
    assert both.value.status == 400


def test_a_body_takes_string_pairs_and_nothing_else() -> None:
    with pytest.raises(ValueError):
        BulkBody.model_validate({"metadata": {"a": 1}})
    with pytest.raises(ValueError):
        BulkBody.model_validate({"filter": {"a": "b"}})


def _m(sid: str, status: sb.SandboxStatus, revision: int = 3) -> Member:
    return Member(sid, "n1", status, revision)


def test_a_kill_takes_every_live_state_a_pause_only_running() -> None:
    members = [_m(s.value, s) for s in S]
    killed = {m.sandbox_id for m in acted_on(members, "kill")}
    assert killed == {s.value for s in S} - {"killing", "killed", "failed"}
    assert {m.sandbox_id for m in acted_on(members, "pause")} == {"running"}


def test_command_ids_repeat_per_revision_and_differ_per_tag() -> None:
    a = end_command(_m("s1", S.RUNNING, 3), "kill", tag="bulk")
    assert a == end_command(_m("s1", S.RUNNING, 3), "kill", tag="bulk").model_copy(
        update={"at": a.at}
    )
    assert a.command_id != end_command(_m("s1", S.RUNNING, 4), "kill", tag="bulk").command_id
    assert a.command_id != end_command(_m("s1", S.RUNNING, 3), "pause", tag="bulk").command_id
    assert isinstance(a, sb.KillSandbox) and a.reason == "request"
    lease = ls.Lease(
        lease_id="l1",
        team_id="t",
        ttl_s=5,
        opened_at=T,
        expires_at=T,
        status=ls.LeaseStatus.EXPIRED,
        ended_at=T,
        on_expiry="pause",
    )
    paused = end_command(_m("s1", S.RUNNING), "pause", tag=sweep_tag(lease))
    assert isinstance(paused, sb.PauseSandbox) and paused.reason == "timeout"
    ended = lease.model_copy(update={"status": ls.LeaseStatus.ENDED})
    assert sweep_tag(ended) != sweep_tag(lease)
    killed = end_command(_m("s1", S.PAUSED), "kill", tag=sweep_tag(ended))
    assert isinstance(killed, sb.KillSandbox) and killed.reason == "request"


def test_every_timer_builds_one_expiry_per_deadline() -> None:
    lease = ls.Lease(lease_id="l1", team_id="t", ttl_s=5, opened_at=T, expires_at=T)
    one, two = expire_command(lease, T), expire_command(lease, datetime.now(UTC))
    assert one.command_id == two.command_id
    later = lease.model_copy(update={"expires_at": datetime.now(UTC)})
    assert expire_command(later, T).command_id != one.command_id


def test_the_answer_names_what_was_done() -> None:
    r = BulkResult("kill", ["a", "b", "c"], done=["c", "a"], failed=[("b", "node refused")])
    assert r.wire() == {
        "action": "kill",
        "count": 2,
        "sandboxIDs": ["a", "c"],
        "matched": 3,
        "failed": [{"sandboxID": "b", "message": "node refused"}],
    }
