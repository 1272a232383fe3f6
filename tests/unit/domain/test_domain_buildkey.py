"""Shared builds: the spec fingerprint, the build key aggregate (who leads, who joins, the
verdict), and a build joining another on its own aggregate."""

from __future__ import annotations

from datetime import timedelta

import pytest

from domain import Conflict, CorruptHistory, Event, Invalid, NotFound
from domain import build as bd
from domain import buildkey as bk
from tests.unit.domain.builders import T0

SPEC = bd.BuildSpec(from_template="base", steps=(bd.BuildStep(type="RUN", args=("echo hi",)),))
FIELDS = {
    "team_id": "t",
    "template_id": "app",
    "base": "template:base",
    "spec": SPEC,
    "cpu_count": 2,
    "memory_mb": 512,
    "disk_size_mb": 2048,
}
KEY = "bk-f"


def _fp(**change: object) -> str | None:
    return bd.spec_fingerprint(**{**FIELDS, **change})  # type: ignore[arg-type]


def test_the_fingerprint_is_a_digest_of_what_the_result_depends_on() -> None:
    fp = _fp()
    assert fp is not None and len(fp) == 64 and fp == _fp()  # pure, stable
    same = bd.BuildSpec(from_template="base", steps=(bd.BuildStep(type="RUN", args=("echo hi",)),))
    assert _fp(spec=same) == fp
    others = [
        _fp(team_id="u"),
        _fp(template_id="other"),
        _fp(base="template:base:b2"),  # the base was rebuilt meanwhile
        _fp(spec=SPEC.model_copy(update={"steps": (bd.BuildStep(type="RUN", args=("echo ho",)),)})),
        _fp(spec=SPEC.model_copy(update={"start_cmd": "sleep 1"})),
        _fp(spec=SPEC.model_copy(update={"ready_cmd": "true"})),
        _fp(spec=bd.BuildSpec(from_image="busybox:1", steps=SPEC.steps)),
        _fp(cpu_count=4),
        _fp(memory_mb=1024),
        _fp(disk_size_mb=4096),
    ]
    assert fp not in others and len(set(others)) == len(others)
    copy = bd.BuildStep(type="COPY", args=("a", "/a"), files_hash="h1")
    other_files = copy.model_copy(update={"files_hash": "h2"})
    assert _fp(spec=SPEC.model_copy(update={"steps": (copy,)})) != _fp(
        spec=SPEC.model_copy(update={"steps": (other_files,)})
    )


def test_a_forced_build_has_no_fingerprint() -> None:
    assert _fp(spec=SPEC.model_copy(update={"force": True})) is None
    step = bd.BuildStep(type="RUN", args=("x",), force=True)
    assert _fp(spec=SPEC.model_copy(update={"steps": (step,)})) is None


def _enter(state: bk.BuildKey | None, build: str, **kw: object) -> list[Event]:
    cmd = bk.EnterBuildKey(key_id=KEY, build_id=build, template_id="app", at=T0, **kw)  # type: ignore[arg-type]
    return bk.decide_build_key(state, cmd)


def _led() -> bk.BuildKey:
    s = bk.fold_build_key(_enter(None, "b1"))
    assert s is not None
    return s


def test_the_first_build_leads_the_others_join_it() -> None:
    [led] = _enter(None, "b1")
    assert isinstance(led, bk.BuildKeyLed) and (led.build_id, led.generation) == ("b1", 1)
    s = _led()
    assert (s.leader, s.followers, s.settled) == ("b1", (), False)
    for b in ("b2", "b3"):
        [joined] = _enter(s, b)
        assert isinstance(joined, bk.BuildKeyJoined) and joined.leader_build_id == "b1"
        s = bk.evolve_build_key(s, joined)  # type: ignore[assignment]
    assert s.followers == ("b2", "b3")
    assert _enter(s, "b1") == [] and _enter(s, "b3") == []  # redelivered starts keep roles
    with pytest.raises(Conflict):
        bk.decide_build_key(
            s, bk.EnterBuildKey(key_id=KEY, build_id="b9", template_id="other", at=T0)
        )


def _settle(s: bk.BuildKey, build: str, **kw: object) -> list[Event]:
    cmd = bk.SettleBuildKey(key_id=KEY, build_id=build, at=T0 + timedelta(seconds=30), **kw)  # type: ignore[arg-type]
    return bk.decide_build_key(s, cmd)


def test_only_the_leader_settles_once() -> None:
    s = _led()
    assert _settle(s, "b2", capture_id="app:b2") == []  # not the leader
    [ev] = _settle(s, "b1", capture_id="app:b1")
    assert isinstance(ev, bk.BuildKeySettled)
    s = bk.evolve_build_key(s, ev)  # type: ignore[assignment]
    assert s.settled and s.ready and s.capture_id == "app:b1"
    assert s.settled_at == T0 + timedelta(seconds=30)
    assert _settle(s, "b1", error="late") == []  # a redelivered verdict
    with pytest.raises(NotFound):
        bk.decide_build_key(None, bk.SettleBuildKey(key_id=KEY, build_id="b1", at=T0))


def test_a_ready_result_is_shared_with_racing_builds_only_while_default() -> None:
    s = bk.fold_build_key(_settle(_led(), "b1", capture_id="app:b1"), _led())
    assert s is not None
    racing = T0 + timedelta(seconds=1)  # started while b1 ran
    [joined] = _enter(s, "b2", current_capture="app:b1", started_at=racing)
    assert isinstance(joined, bk.BuildKeyJoined)
    # asked for after the verdict: a build of its own (a new generation)
    later = T0 + timedelta(minutes=5)
    [led] = _enter(s, "b3", current_capture="app:b1", started_at=later)
    assert isinstance(led, bk.BuildKeyLed) and led.generation == 2
    # `default` moved to another build since: b1's capture may be dropped, build again
    [led] = _enter(s, "b4", current_capture="app:other", started_at=racing)
    assert isinstance(led, bk.BuildKeyLed)


def test_a_failed_generation_is_led_afresh() -> None:
    s = bk.fold_build_key(_settle(_led(), "b1", error="RUN exited 1", step="1"), _led())
    assert s is not None and s.settled and not s.ready and s.error == "RUN exited 1"
    [led] = _enter(s, "b2", started_at=T0)
    assert isinstance(led, bk.BuildKeyLed) and led.generation == 2
    s = bk.evolve_build_key(s, led)
    assert s is not None and (s.leader, s.followers, s.settled, s.error) == ("b2", (), False, None)


def test_history_must_start_with_a_leader() -> None:
    joined = bk.BuildKeyJoined(key_id=KEY, build_id="b2", leader_build_id="b1", at=T0)
    with pytest.raises(CorruptHistory):
        bk.evolve_build_key(None, joined)
    with pytest.raises(CorruptHistory):
        bk.evolve_build_key(None, bd.TemplateBuildClaimed(build_id="b1", at=T0))


def _started(build_id: str = "b2") -> bd.Build:
    req = bd.RequestTemplateBuild(build_id=build_id, template_id="app", team_id="t", at=T0)
    s = bd.fold_build(bd.decide_build(None, req))
    start = bd.StartTemplateBuild(build_id=build_id, spec=SPEC, at=T0)
    s = bd.fold_build(bd.decide_build(s, start), s)
    assert s is not None and s.queued
    return s


def test_a_build_joins_its_leader_instead_of_running() -> None:
    s = _started()
    join = bd.JoinTemplateBuild(build_id="b2", leader_build_id="b1", key_id=KEY, at=T0)
    [ev] = bd.decide_build(s, join)
    assert isinstance(ev, bd.TemplateBuildJoined)
    s = bd.fold_build([ev], s)
    assert s is not None and not s.queued and s.status is bd.BuildStatus.BUILDING
    assert (s.leader_build_id, s.key_id) == ("b1", KEY)
    assert bd.decide_build(s, join) == []  # redelivered
    assert bd.decide_build(s, bd.ClaimTemplateBuild(build_id="b2")) == []  # not run too
    done = bd.CompleteTemplateBuild(build_id="b2", envd_version="0.6.4")
    s = bd.fold_build(bd.decide_build(s, done), s)
    assert s is not None and s.status is bd.BuildStatus.READY and s.sandbox_id is None
    assert bd.decide_build(s, join) == []  # ended by its leader's verdict first


def test_a_join_needs_a_started_build_and_another_leader() -> None:
    req = bd.RequestTemplateBuild(build_id="b2", template_id="app", team_id="t", at=T0)
    waiting = bd.fold_build(bd.decide_build(None, req))
    join = bd.JoinTemplateBuild(build_id="b2", leader_build_id="b1", key_id=KEY, at=T0)
    with pytest.raises(Conflict):
        bd.decide_build(waiting, join)
    with pytest.raises(Invalid):
        bd.decide_build(_started(), join.model_copy(update={"leader_build_id": "b2"}))


def test_a_claim_records_the_key_it_leads() -> None:
    [ev] = bd.decide_build(_started(), bd.ClaimTemplateBuild(build_id="b2", key_id=KEY))
    s = bd.fold_build([ev], _started())
    assert s is not None and s.key_id == KEY and s.leader_build_id is None and not s.queued
