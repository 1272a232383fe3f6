"""The template build aggregate: waiting → building → ready | error, with a bounded log."""

from __future__ import annotations

from datetime import timedelta

import pytest

from domain import Conflict, CorruptHistory, Invalid, NotFound
from domain import build as bd
from tests.unit.domain.builders import T0

SPEC = bd.BuildSpec(
    from_template="base",
    steps=(bd.BuildStep(type="RUN", args=("echo hi",)), bd.BuildStep(type="ENV", args=("A", "1"))),
)


def _requested() -> bd.Build:
    cmd = bd.RequestTemplateBuild(
        build_id="b1", template_id="my-tpl", alias="my-tpl", team_id="t", at=T0
    )
    s = bd.fold_build(bd.decide_build(None, cmd))
    assert s is not None
    return s


def _started() -> bd.Build:
    s = _requested()
    s2 = bd.fold_build(bd.decide_build(s, bd.StartTemplateBuild(build_id="b1", spec=SPEC)), s)
    assert s2 is not None
    return s2


def test_request_start_log_and_finish() -> None:
    s = _requested()
    assert s.status is bd.BuildStatus.WAITING and s.requested_at == T0
    s = _started()
    assert s.status is bd.BuildStatus.BUILDING and s.spec == SPEC
    line = bd.BuildLogEntry(at=T0 + timedelta(seconds=1), message="step 1", step="1")
    ev = bd.decide_build(s, bd.LogTemplateBuild(build_id="b1", entries=(line, line)))
    assert isinstance(ev[0], bd.TemplateBuildLogged) and ev[0].first_index == 0
    s = bd.fold_build(ev, s)
    assert s is not None and s.log_count == 2
    ev2 = bd.decide_build(s, bd.LogTemplateBuild(build_id="b1", entries=(line,)))
    assert isinstance(ev2[0], bd.TemplateBuildLogged) and ev2[0].first_index == 2
    done = bd.CompleteTemplateBuild(build_id="b1", sandbox_id="sbx", envd_version="0.6.4")
    s = bd.fold_build(bd.decide_build(s, done), s)
    assert s is not None and s.status is bd.BuildStatus.READY and s.finished_at is not None
    assert bd.decide_build(s, done) == []  # a redelivered verdict
    assert bd.decide_build(s, bd.LogTemplateBuild(build_id="b1", entries=(line,))) == []


def test_failure_keeps_reason_and_step() -> None:
    s = _started()
    fail = bd.CompleteTemplateBuild(build_id="b1", error="RUN exited with 3", step="2")
    s = bd.fold_build(bd.decide_build(s, fail), s)
    assert s is not None and s.status is bd.BuildStatus.ERROR
    assert (s.reason, s.failed_step) == ("RUN exited with 3", "2")


def test_refusals() -> None:
    with pytest.raises(NotFound):
        bd.decide_build(None, bd.StartTemplateBuild(build_id="x", spec=SPEC))
    with pytest.raises(Invalid):  # names double as ids and snapshot names
        bd.decide_build(None, bd.RequestTemplateBuild(build_id="b", template_id="Bad Name"))
    s = _requested()
    with pytest.raises(Invalid):
        bd.decide_build(s, bd.StartTemplateBuild(build_id="b1", spec=bd.BuildSpec()))
    both = bd.BuildSpec(from_template="base", from_image="/x")
    with pytest.raises(Invalid):
        bd.decide_build(s, bd.StartTemplateBuild(build_id="b1", spec=both))
    with pytest.raises(Conflict):  # finishing a build that never started
        bd.decide_build(s, bd.CompleteTemplateBuild(build_id="b1"))
    started = _started()
    assert bd.decide_build(started, bd.StartTemplateBuild(build_id="b1", spec=SPEC)) == []
    other = SPEC.model_copy(update={"start_cmd": "x"})
    with pytest.raises(Conflict):
        bd.decide_build(started, bd.StartTemplateBuild(build_id="b1", spec=other))
    again = bd.RequestTemplateBuild(build_id="b1", template_id="my-tpl")
    assert bd.decide_build(s, again) == []
    with pytest.raises(Conflict):
        bd.decide_build(s, again.model_copy(update={"template_id": "other"}))
    with pytest.raises(CorruptHistory):
        bd.evolve_build(None, bd.TemplateBuilt(build_id="b", at=T0))


def test_log_is_bounded() -> None:
    s = _started()
    huge = bd.BuildLogEntry(at=T0, message="x" * (bd.MAX_LOG_MESSAGE * 2))
    ev = bd.decide_build(s, bd.LogTemplateBuild(build_id="b1", entries=(huge,) * 500))
    assert isinstance(ev[0], bd.TemplateBuildLogged)
    assert len(ev[0].entries) == bd.MAX_LOG_BATCH
    assert all(len(e.message) == bd.MAX_LOG_MESSAGE for e in ev[0].entries)
    full = s.model_copy(update={"log_count": bd.MAX_LOG_ENTRIES})
    line = bd.BuildLogEntry(at=T0, message="more")
    assert bd.decide_build(full, bd.LogTemplateBuild(build_id="b1", entries=(line,))) == []


def test_a_started_build_is_building_while_it_waits_for_a_builder() -> None:
    """E2B's `building` starts when the steps are sent, not when a builder gets to it; a
    builder's claim is what a redelivered start is told apart by."""
    s = _started()
    assert s.status is bd.BuildStatus.BUILDING and s.queued
    claim = bd.ClaimTemplateBuild(build_id="b1")
    events = bd.decide_build(s, claim)
    assert [type(e) for e in events] == [bd.TemplateBuildClaimed]
    s = bd.fold_build(events, s)
    assert s is not None and s.status is bd.BuildStatus.BUILDING and not s.queued
    assert bd.decide_build(s, claim) == []  # claimed: another builder has it
    assert bd.decide_build(s, bd.StartTemplateBuild(build_id="b1", spec=SPEC)) == []
    with pytest.raises(Conflict):  # nothing to claim before the start
        bd.decide_build(_requested(), claim)
    done = bd.fold_build(bd.decide_build(s, bd.CompleteTemplateBuild(build_id="b1")), s)
    assert done is not None and not done.queued and bd.decide_build(done, claim) == []


def test_a_start_from_before_claims_was_the_builder_running_it() -> None:
    old = bd.TemplateBuildStarted(build_id="b1", spec=SPEC, at=T0)  # no `queued`: old log
    s = bd.fold_build([old], _requested())
    assert s is not None and s.status is bd.BuildStatus.BUILDING and not s.queued


def test_a_requests_tags_are_normalised() -> None:
    cmd = bd.RequestTemplateBuild(build_id="b2", template_id="app", tags=("V1", "v1", "x"))
    s = bd.fold_build(bd.decide_build(None, cmd))
    assert s is not None and s.tags == ("v1", "x")
    with pytest.raises(Invalid):
        bd.decide_build(None, cmd.model_copy(update={"tags": ("no spaces",)}))


def test_a_failed_or_waiting_build_is_discarded_once_a_running_one_is_not() -> None:
    """`DELETE /templates/{id}` of a template no build published discards its builds."""
    discard = bd.DiscardTemplateBuild(build_id="b1")
    with pytest.raises(Conflict):
        bd.decide_build(_started(), discard)  # still running: it may yet publish
    with pytest.raises(NotFound):
        bd.decide_build(None, discard)
    fail = bd.CompleteTemplateBuild(build_id="b1", error="RUN exited with 3", step="2")
    failed = bd.fold_build(bd.decide_build(_started(), fail), _started())
    assert failed is not None and not failed.discarded
    for s in (failed, _requested()):
        ev = bd.decide_build(s, discard)
        assert [type(e) for e in ev] == [bd.TemplateBuildDiscarded]
        gone = bd.fold_build(ev, s)
        assert gone is not None and gone.discarded and gone.status is s.status
        assert bd.decide_build(gone, discard) == []  # a retried delete
    gone = bd.fold_build(bd.decide_build(_requested(), discard), _requested())
    with pytest.raises(NotFound):  # a discarded build never starts
        bd.decide_build(gone, bd.StartTemplateBuild(build_id="b1", spec=SPEC))
