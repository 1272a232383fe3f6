"""Admission control's parts in the API that need no services (issue 32): which limits a
caller gets from the settings, `AENV_TEAM_LIMITS` and its key; a bad `AENV_TEAM_LIMITS`
fails the API's start; what a running-limit refusal says to wait; the OpenAPI document
names the 429 on the routes that start sandboxes."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from api.admission import Ticket, _running_retry, limits_for
from api.admission_state import CENSUS_TTL_S, AdmissionState
from api.auth import Caller
from api.context import ApiSettings
from api.errors import ADMITTED, ERRORS
from domain.limits import Limits
from projections.census import TeamCensus

TEAMS = '{"big": {"max_sandboxes": 100, "creates_per_s": 20}, "free": {"max_sandboxes": 0}}'


def _settings(**kw: object) -> ApiSettings:
    return ApiSettings(team_max_sandboxes=10, team_creates_per_s=2, team_limits=TEAMS, **kw)  # type: ignore[arg-type]


def test_a_caller_gets_its_keys_then_its_teams_then_the_default_limits() -> None:
    s, state = _settings(), AdmissionState()
    plain = limits_for(s, state, Caller("k1", "someone"))
    assert (plain.max_sandboxes, plain.creates_per_s, plain.burst) == (10, 2.0, 2)
    assert plain.max_from == "AENV_TEAM_MAX_SANDBOXES" and plain.bucket == "team.someone"
    big = limits_for(s, state, Caller("k2", "big"))
    assert (big.max_sandboxes, big.creates_per_s, big.max_from) == (100, 20.0, "team big")
    assert not limits_for(s, state, Caller("k3", "free")).max_sandboxes  # 0: none
    keyed = limits_for(s, state, Caller("k4", "big", Limits(max_sandboxes=3, burst=50)))
    assert (keyed.max_sandboxes, keyed.max_from) == (3, "key k4")
    assert (keyed.creates_per_s, keyed.burst, keyed.bucket) == (20.0, 50, "key.k4")


def test_off_by_default() -> None:
    assert not limits_for(ApiSettings(), AdmissionState(), Caller("k", "t")).limited


@pytest.mark.parametrize(
    "bad", ['{"t": {"max_sandboxes": -1}}', "[1]", '{"t": 5}', "{not json", '{"t": {"x": 1}}']
)
def test_a_bad_team_limits_setting_fails_the_start(bad: str) -> None:
    if bad == '{"t": {"x": 1}}':  # an unknown field is ignored (a newer setting)
        ApiSettings(team_limits=bad)
        return
    with pytest.raises(ValidationError):
        ApiSettings(team_limits=bad)


def test_retry_after_of_a_full_team_is_its_first_ttl_within_reason() -> None:
    now = datetime.now(UTC)
    assert _running_retry(None) == 5
    assert _running_retry(now + timedelta(seconds=7.2)) == 8
    assert _running_retry(now - timedelta(seconds=3)) == 1  # overdue: any moment now
    assert _running_retry(now + timedelta(hours=1)) == 30


def test_the_routes_that_start_sandboxes_document_the_429() -> None:
    assert 429 in ADMITTED and 429 not in ERRORS


def test_a_census_drops_the_held_ids_it_counts_and_ages_out() -> None:
    state = AdmissionState()
    held = state.held("t")
    held.update({"a": float("inf"), "b": float("inf"), "c": float("inf"), "d": float("inf")})
    seen = {"a": "running", "b": "paused", "c": "killed"}  # b: a resume on its way
    state.counted("t", TeamCensus(running=5, soonest_end=None, seen=seen))
    assert set(state.held("t")) == {"b", "d"}  # a is in the 5 now, c is gone
    census = state.census("t")
    assert census is not None and census.running == 5
    state._censuses["t"] = (time.monotonic() - CENSUS_TTL_S, census)
    assert state.census("t") is None  # too old to admit with


def test_a_new_sandbox_leaves_the_held_ones_at_its_first_row_a_resumed_one_once_it_holds_a_vm() -> (
    None
):
    """Created, then paused before any census saw it running: the read model counts it
    rightly (paused holds no VM), so it is no longer held (it was, as running, for 30 s).
    A resume's sandbox has a paused row from before: that row is not its resume yet."""
    state = AdmissionState()
    made = Ticket(state, "t", ["new1", "new2"])
    made.track(["new1", "new2"])
    resumed = Ticket(state, "t", ["old"], new=False)
    resumed.track(["old"])
    seen = {"new1": "paused", "old": "paused"}
    state.counted("t", TeamCensus(running=0, soonest_end=None, seen=seen))
    assert set(state.held("t")) == {"new2", "old"}
    made.end(made=True)  # the request ends after that census: new1 is not held again
    resumed.end(made=True)
    assert set(state.held("t")) == {"new2", "old"}
    state.counted("t", TeamCensus(running=1, soonest_end=None, seen={"old": "resuming"}))
    assert set(state.held("t")) == {"new2"}
    assert state.new("t") == {"new2"}
