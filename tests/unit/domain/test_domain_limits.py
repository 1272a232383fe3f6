"""Admission limits without I/O (issue 32): which source a limit comes from (key → team →
defaults), the token bucket (GCRA) a team's creation rate is counted in, and a key's
limits as events of its aggregate."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from domain import Conflict, NotFound
from domain import apikey as ak
from domain.limits import Limits, resolve, take_tokens

T0 = datetime(2026, 12, 7, tzinfo=UTC)
DEFAULT = Limits(max_sandboxes=20, creates_per_s=5, burst=0)


def test_each_field_comes_from_the_first_source_that_sets_it() -> None:
    key = Limits(max_sandboxes=100)
    team = Limits(max_sandboxes=50, creates_per_s=10, burst=30)
    e = resolve("t1", "k1", key, team, DEFAULT)
    assert (e.max_sandboxes, e.max_from) == (100, "key k1")
    assert (e.creates_per_s, e.burst, e.rate_from) == (10, 30, "team t1")
    assert e.bucket == "team.t1"  # the key sets no rate: the team's bucket
    e = resolve("t1", "k1", None, None, DEFAULT)
    assert (e.max_sandboxes, e.max_from) == (20, "AENV_TEAM_MAX_SANDBOXES")
    assert (e.creates_per_s, e.rate_from) == (5, "AENV_TEAM_CREATES_PER_S")
    assert e.burst == 5  # 0: one second's worth


def test_a_key_with_its_own_rate_has_its_own_bucket_and_zero_lifts_a_limit() -> None:
    e = resolve("t1", "k1", Limits(creates_per_s=0.5), Limits(creates_per_s=10), DEFAULT)
    assert (e.creates_per_s, e.burst, e.bucket) == (0.5, 1, "key.k1")  # burst ≥ 1
    e = resolve("t1", "k1", Limits(max_sandboxes=0, creates_per_s=0), None, DEFAULT)
    assert not e.limited  # 0 set on the key wins over the defaults' 20 and 5/s
    assert not resolve("t", "k", None, None, Limits()).limited


def test_a_full_bucket_gives_its_burst_then_one_token_per_interval() -> None:
    tat, now = None, 1000.0
    for _ in range(3):  # burst 3 at once
        d = take_tokens(tat, now, rate=2, burst=3)
        assert d.allowed
        tat = d.tat
    refused = take_tokens(tat, now, rate=2, burst=3)
    assert not refused.allowed and refused.retry_after_s == pytest.approx(0.5)
    assert take_tokens(tat, now + 0.49, rate=2, burst=3).allowed is False
    later = take_tokens(tat, now + 0.5, rate=2, burst=3)
    assert later.allowed and later.tat == pytest.approx(now + 2.0)
    # idle long enough: full again, never more than the burst
    full = take_tokens(later.tat, now + 100, rate=2, burst=3)
    assert full.allowed and full.tat == pytest.approx(now + 100.5)


def test_sustained_rate_is_the_rate() -> None:
    """At 100 attempts a second for 10 s, 5/s burst 5 lets through the burst, then one
    every 0.2 s: at 0.2 … 9.8 s (49)."""
    tat: float | None = None
    allowed = 0
    for i in range(1000):
        d = take_tokens(tat, 1000.0 + i * 0.01, rate=5, burst=5)
        if d.allowed:
            allowed += 1
            tat = d.tat
    assert allowed == 5 + 49


def test_taking_several_and_more_than_the_burst() -> None:
    d = take_tokens(None, 0.0, rate=10, burst=8, n=8)
    assert d.allowed and d.tat == pytest.approx(0.8)
    no = take_tokens(d.tat, 0.0, rate=10, burst=8, n=2)
    assert not no.allowed and no.retry_after_s == pytest.approx(0.2)
    # a fork of 20 on a bucket of 8: only when full, and leaves the debt
    assert not take_tokens(d.tat, 0.5, rate=10, burst=8, n=20).allowed
    big = take_tokens(d.tat, 0.8, rate=10, burst=8, n=20)
    assert big.allowed and big.tat == pytest.approx(2.8)
    assert not take_tokens(big.tat, 0.8, rate=10, burst=8).allowed
    assert take_tokens(None, 0.0, rate=0, burst=1, n=1000).allowed  # no rate: no limit


def test_limits_refuse_nonsense() -> None:
    with pytest.raises(ValueError):
        Limits(max_sandboxes=-1)
    with pytest.raises(ValueError):
        Limits(creates_per_s=-0.1)


def test_a_keys_limits_are_events_of_the_key() -> None:
    create = ak.CreateApiKey(key_id="k1", team_id="t1", prefix="e2b_ab", key_sha256="0" * 64, at=T0)
    s = ak.fold_api_key(ak.decide_api_key(None, create))
    assert s is not None and s.limits == Limits()
    set_ = ak.SetApiKeyLimits(key_id="k1", limits=Limits(max_sandboxes=3), at=T0)
    [event] = ak.decide_api_key(s, set_)
    assert isinstance(event, ak.ApiKeyLimitsSet)
    s = ak.fold_api_key([event], s)
    assert s is not None and s.limits.max_sandboxes == 3
    assert ak.decide_api_key(s, set_) == []  # the same again: nothing happens
    cleared = ak.fold_api_key(ak.decide_api_key(s, ak.SetApiKeyLimits(key_id="k1")), s)
    assert cleared is not None and cleared.limits.is_empty()
    with pytest.raises(NotFound):
        ak.decide_api_key(None, set_)
    revoked = ak.fold_api_key(ak.decide_api_key(s, ak.RevokeApiKey(key_id="k1")), s)
    with pytest.raises(Conflict):
        ak.decide_api_key(revoked, set_)
