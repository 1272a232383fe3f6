"""The sandbox rules beyond the state matrix: TTL, validation, idempotency, outcomes."""

from __future__ import annotations

from collections.abc import Callable
from uuid import uuid4

import pytest
from pydantic import ValidationError

from domain import Conflict, CorruptHistory, Invalid, NotFound
from domain import sandbox as sb
from tests.unit.domain.builders import (
    SID,
    T0,
    at,
    create,
    creating,
    forking,
    paused,
    pausing,
    running,
    snapshotting,
    step,
)

S = sb.SandboxStatus


class TestCreate:
    def test_requested_carries_everything_the_read_model_needs(self) -> None:
        c = create(
            alias="py",
            team_id="t1",
            api_key_id="k1",
            cpu_count=4,
            memory_mb=1024,
            disk_size_mb=4096,
            envd_access_token="tok",
            metadata={"a": "b"},
            env_vars={"X": "1"},
            lifecycle=sb.Lifecycle(on_timeout="pause"),
            network=sb.NetworkPolicy(allow_internet_access=False),
        )
        [e] = sb.decide(None, c)
        assert isinstance(e, sb.SandboxRequested)
        s = sb.fold([e])
        assert s is not None and s.status is S.CREATING
        assert (s.alias, s.team_id, s.cpu_count, s.memory_mb, s.metadata) == (
            "py",
            "t1",
            4,
            1024,
            {"a": "b"},
        )
        assert s.lifecycle.on_timeout == "pause" and not s.network.allow_internet_access

    def test_created_starts_the_ttl(self) -> None:
        s = running()
        assert s.started_at == at(1) and s.end_at == at(61) and s.node_id == "n1"

    @pytest.mark.parametrize(
        "field,value",
        [
            ("timeout_s", 0),
            ("timeout_s", 86_401),
            ("cpu_count", 0),
            ("cpu_count", 65),
            ("memory_mb", 64),
            ("disk_size_mb", 0),
        ],
    )
    def test_out_of_range_is_invalid(self, field: str, value: int) -> None:
        with pytest.raises(Invalid):
            sb.decide(None, create(**{field: value}))

    def test_bounds_are_inclusive(self) -> None:
        assert sb.decide(None, create(timeout_s=1))
        assert sb.decide(None, create(timeout_s=86_400))

    def test_bad_sandbox_id_is_a_validation_error(self) -> None:
        with pytest.raises(ValidationError):
            create(sandbox_id="Not_OK")

    def test_unknown_field_is_a_validation_error(self) -> None:
        with pytest.raises(ValidationError):
            create(bogus=1)

    def test_create_failure(self) -> None:
        s = step(
            creating(), sb.CompleteCreate(sandbox_id=SID, node_id="n", at=at(1), error="no kvm")
        )
        assert s is not None and s.status is S.FAILED and s.failure_reason == "create: no kvm"

    def test_a_create_refused_for_disk_room_says_unavailable(self) -> None:
        """The node's disk budget could not fit its writes (`NoRoom`): the API answers 503."""
        done = sb.CompleteCreate(
            sandbox_id=SID, node_id="n", at=at(1), error="no room", code="unavailable"
        )
        [failed] = sb.decide(creating(), done)
        assert isinstance(failed, sb.SandboxFailed) and failed.code == "unavailable"


class TestIngress:
    """`network.allowPublicTraffic=false`: the sandbox's guest ports need its traffic token."""

    PRIVATE = sb.NetworkPolicy(allow_public_traffic=False)

    def test_a_private_sandbox_keeps_its_traffic_token(self) -> None:
        s = creating(network=self.PRIVATE, traffic_access_token="ttok")
        assert s.traffic_access_token == "ttok" and not s.network.allow_public_traffic

    def test_a_private_sandbox_without_a_token_is_invalid(self) -> None:
        with pytest.raises(Invalid, match="allowPublicTraffic=false"):
            sb.decide(None, create(network=self.PRIVATE))

    def test_a_public_sandbox_with_a_token_is_invalid(self) -> None:
        with pytest.raises(Invalid, match="only for allowPublicTraffic=false"):
            sb.decide(None, create(traffic_access_token="ttok"))

    def test_a_public_sandbox_has_none(self) -> None:
        assert creating().traffic_access_token is None

    def test_a_requested_event_from_before_the_token_reads_as_public(self) -> None:
        """Events written before the field existed lack it: they decode, token None."""
        [e] = sb.decide(None, create())
        raw = e.model_dump(mode="json")
        del raw["spec"]["traffic_access_token"]
        old = sb.SandboxRequested.model_validate(raw)
        assert old.spec.traffic_access_token is None and old.spec.network.allow_public_traffic


class TestTtl:
    def test_pause_stores_remaining_and_resume_restores_it(self) -> None:
        s = paused()  # created at 1 s with 60 s, paused at 21 s
        assert s.remaining_s == pytest.approx(40)
        s = step(s, sb.ResumeSandbox(sandbox_id=SID, at=at(1000)))
        s = step(s, sb.CompleteResume(sandbox_id=SID, node_id="n2", at=at(1002)))
        assert s is not None and s.status is S.RUNNING
        assert s.end_at == at(1042) and s.node_id == "n2" and s.remaining_s is None

    def test_failed_resume_leaves_it_paused_and_resumable(self) -> None:
        """A capture that could not be fetched (S3 down) is no reason to lose the sandbox."""
        s = step(paused(), sb.ResumeSandbox(sandbox_id=SID, at=at(500)))
        events = sb.decide(
            s,
            sb.CompleteResume(
                sandbox_id=SID, node_id="n", at=at(501), error="could not be fetched"
            ),
        )
        assert [type(e) for e in events] == [sb.SandboxResumeFailed]
        s = step(s, sb.CompleteResume(sandbox_id=SID, node_id="n", at=at(501), error="x"))
        assert s is not None and s.status is S.PAUSED and s.remaining_s == pytest.approx(40)
        s = step(s, sb.ResumeSandbox(sandbox_id=SID, at=at(600)))
        s = step(s, sb.CompleteResume(sandbox_id=SID, node_id="n", at=at(601)))
        assert s is not None and s.status is S.RUNNING and s.end_at == at(641)

    def test_resume_with_timeout_sets_a_fresh_ttl(self) -> None:
        s = step(paused(), sb.ResumeSandbox(sandbox_id=SID, at=at(500), timeout_s=300))
        s = step(s, sb.CompleteResume(sandbox_id=SID, node_id="n1", at=at(501)))
        assert s is not None and s.end_at == at(801)

    def test_expired_then_resumed_gets_its_last_timeout(self) -> None:
        s = step(running(), sb.PauseSandbox(sandbox_id=SID, at=at(61), reason="timeout"))
        s = step(s, sb.CompletePause(sandbox_id=SID, at=at(70)))
        assert s is not None and s.remaining_s == 0
        s = step(s, sb.ResumeSandbox(sandbox_id=SID, at=at(100)))
        s = step(s, sb.CompleteResume(sandbox_id=SID, node_id="n1", at=at(100)))
        assert s is not None and s.end_at == at(160)

    def test_a_paused_sandbox_keeps_what_its_resume_gives(self) -> None:
        """`ttl_on_resume`: what `aenv ls` and the API show of a paused sandbox is what
        the resume then gives it."""
        s = paused()
        assert s is not None and s.ttl_on_resume == pytest.approx(40)
        expired = step(running(), sb.PauseSandbox(sandbox_id=SID, at=at(61), reason="timeout"))
        expired = step(expired, sb.CompletePause(sandbox_id=SID, at=at(70)))
        assert expired is not None and expired.ttl_on_resume == 60
        assert sb.ttl_on_resume(None, 300) == 300 and sb.ttl_on_resume(12.5, 300) == 12.5

    def test_set_timeout_running(self) -> None:
        s = step(running(), sb.SetSandboxTimeout(sandbox_id=SID, at=at(10), timeout_s=5))
        assert s is not None and s.end_at == at(15) and s.timeout_s == 5

    def test_set_timeout_paused_sets_remaining(self) -> None:
        s = step(paused(), sb.SetSandboxTimeout(sandbox_id=SID, at=at(30), timeout_s=500))
        assert s is not None and s.remaining_s == 500 and s.status is S.PAUSED

    def test_extend_only_never_shortens(self) -> None:
        s = running()  # end_at = 61 s
        assert (
            sb.decide(
                s, sb.SetSandboxTimeout(sandbox_id=SID, at=at(10), timeout_s=30, extend_only=True)
            )
            == []
        )
        [e] = sb.decide(
            s, sb.SetSandboxTimeout(sandbox_id=SID, at=at(10), timeout_s=300, extend_only=True)
        )
        assert isinstance(e, sb.SandboxTimeoutSet) and e.end_at == at(310)
        p = paused()  # 40 s left
        assert (
            sb.decide(
                p, sb.SetSandboxTimeout(sandbox_id=SID, at=at(30), timeout_s=10, extend_only=True)
            )
            == []
        )

    @pytest.mark.parametrize("timeout", [0, -5, 86_401])
    def test_timeout_range(self, timeout: int) -> None:
        with pytest.raises(Invalid):
            sb.decide(running(), sb.SetSandboxTimeout(sandbox_id=SID, timeout_s=timeout))
        with pytest.raises(Invalid):
            sb.decide(paused(), sb.ResumeSandbox(sandbox_id=SID, timeout_s=timeout))

    def test_policy_is_configurable(self) -> None:
        policy = sb.Policy(max_timeout_s=10)
        with pytest.raises(Invalid):
            sb.decide(running(), sb.SetSandboxTimeout(sandbox_id=SID, timeout_s=11), policy)


class TestFork:
    def test_children_ids_are_deterministic(self) -> None:
        cid = uuid4()
        cmd = sb.ForkSandbox(sandbox_id=SID, command_id=cid, count=3, at=at(5))
        [e1] = sb.decide(running(), cmd)
        [e2] = sb.decide(running(), cmd)
        assert isinstance(e1, sb.SandboxForkRequested) and e1 == e2
        assert len(set(e1.child_ids)) == 3
        assert all(len(c) == 20 and c.isalnum() and c.islower() for c in e1.child_ids)

    @pytest.mark.parametrize("count", [0, -1, 17])
    def test_count_outside_default_limit(self, count: int) -> None:
        with pytest.raises(Invalid):
            sb.decide(running(), sb.ForkSandbox(sandbox_id=SID, count=count))

    def test_limit_configurable_up_to_100(self) -> None:
        policy = sb.Policy(max_fork_count=100)
        [e] = sb.decide(running(), sb.ForkSandbox(sandbox_id=SID, count=100), policy)
        assert isinstance(e, sb.SandboxForkRequested) and len(e.child_ids) == 100
        with pytest.raises(Invalid):
            sb.decide(running(), sb.ForkSandbox(sandbox_id=SID, count=101), policy)
        with pytest.raises(ValidationError):
            sb.Policy(max_fork_count=101)

    def test_fork_of_paused_is_conflict(self) -> None:
        with pytest.raises(Conflict):
            sb.decide(paused(), sb.ForkSandbox(sandbox_id=SID, count=2))

    def test_forked_reports_each_child(self) -> None:
        s = forking()
        a, b, c = s.pending_children
        [e] = sb.decide(
            s,
            sb.CompleteFork(
                sandbox_id=SID,
                at=at(9),
                children=(
                    sb.ForkChildResult(sandbox_id=a),
                    sb.ForkChildResult(sandbox_id=b, error="oom"),
                ),
            ),
        )
        assert isinstance(e, sb.SandboxForked)
        assert [(x.sandbox_id, x.error) for x in e.children] == [
            (a, None),
            (b, "oom"),
            (c, "child was not attempted"),
        ]
        after = sb.evolve(s, e)
        assert after is not None and after.status is S.RUNNING and after.pending_children == ()

    def test_unknown_child_is_invalid(self) -> None:
        with pytest.raises(Invalid):
            sb.decide(
                forking(),
                sb.CompleteFork(sandbox_id=SID, children=(sb.ForkChildResult(sandbox_id="zzz"),)),
            )

    def test_child_command_inherits_parent(self) -> None:
        cmd = sb.ForkSandbox(sandbox_id=SID, count=2, timeout_s=30)
        parent = step(running(metadata={"k": "v"}, alias="py"), cmd)
        assert parent is not None and len(parent.pending_children) == 2
        child = sb.fork_child_command(parent, parent.pending_children[0], cmd)
        again = sb.fork_child_command(parent, parent.pending_children[0], cmd)
        assert child == again and child.forked_from == SID and child.timeout_s == 30
        assert child.metadata == {"k": "v"} and child.alias == "py"
        assert child.command_id == sb.derived_command_id(str(cmd.command_id), child.sandbox_id)
        with pytest.raises(Invalid):
            sb.fork_child_command(parent, "other", cmd)


class TestSnapshot:
    def test_taken_returns_to_running(self) -> None:
        s = step(
            snapshotting(),
            sb.CompleteSnapshot(sandbox_id=SID, snapshot_id="snap:v1", size_bytes=10),
        )
        assert s is not None and s.status is S.RUNNING and s.pending_snapshot_id is None

    def test_failure_keeps_it_running(self) -> None:
        [e] = sb.decide(
            snapshotting(),
            sb.CompleteSnapshot(sandbox_id=SID, snapshot_id="snap:v1", error="disk full"),
        )
        assert isinstance(e, sb.SnapshotFailed)
        after = sb.evolve(snapshotting(), e)
        assert after is not None and after.status is S.RUNNING

    def test_other_snapshot_is_conflict(self) -> None:
        with pytest.raises(Conflict):
            sb.decide(snapshotting(), sb.CompleteSnapshot(sandbox_id=SID, snapshot_id="x:y"))


class TestOutcomesAndIdempotency:
    def test_a_resume_delivered_again_after_a_kill_decides_nothing(self) -> None:
        """The node died right after recording the resume; its restart reported the VM
        lost (killed), then the resume came again: it had its outcome already, so it is
        not refused — a refusal would be its second outcome."""
        resume = sb.ResumeSandbox(sandbox_id=SID, at=at(100))
        s = step(paused(), resume)
        s = step(s, sb.CompleteResume(sandbox_id=SID, node_id="n1", at=at(101)))
        s = step(s, sb.KillSandbox(sandbox_id=SID, at=at(102), reason="lost"))
        s = step(s, sb.CompleteKill(sandbox_id=SID, at=at(103)))
        assert s is not None and s.status is S.KILLED
        assert sb.decide(s, resume) == []
        with pytest.raises(NotFound):  # a new resume of the killed sandbox
            sb.decide(s, sb.ResumeSandbox(sandbox_id=SID, at=at(104)))

    @pytest.mark.parametrize(
        "build,complete",
        [
            (pausing, lambda: sb.CompletePause(sandbox_id=SID, error="qmp")),
            # (a failed resume leaves the sandbox paused: TestTtl)
        ],
    )
    def test_failed_operation_fails_the_sandbox(
        self, build: Callable[[], sb.State], complete: Callable[[], sb.SandboxCommand]
    ) -> None:
        [e] = sb.decide(build(), complete())
        assert isinstance(e, sb.SandboxFailed)
        after = sb.evolve(build(), e)
        assert after is not None and after.status is S.FAILED

    def test_failed_sandbox_can_be_killed(self) -> None:
        s = step(creating(), sb.CompleteCreate(sandbox_id=SID, node_id="n", error="x"))
        s = step(s, sb.KillSandbox(sandbox_id=SID))
        s = step(s, sb.CompleteKill(sandbox_id=SID))
        assert s is not None and s.status is S.KILLED

    def test_kill_of_killed_is_not_found(self) -> None:
        s = step(step(running(), sb.KillSandbox(sandbox_id=SID)), sb.CompleteKill(sandbox_id=SID))
        with pytest.raises(NotFound):
            sb.decide(s, sb.KillSandbox(sandbox_id=SID))
        with pytest.raises(NotFound):
            sb.decide(s, sb.PauseSandbox(sandbox_id=SID))

    @pytest.mark.parametrize(
        "command",
        [
            sb.PauseSandbox(sandbox_id=SID),
            sb.KillSandbox(sandbox_id=SID),
            sb.ForkSandbox(sandbox_id=SID, count=2),
            sb.SnapshotSandbox(sandbox_id=SID, snapshot_id="a:b"),
            sb.SetSandboxTimeout(sandbox_id=SID, timeout_s=9),
        ],
        ids=lambda c: type(c).__name__,
    )
    def test_redelivered_command_decides_nothing(self, command: sb.SandboxCommand) -> None:
        s = running()
        events = sb.decide(s, command)
        assert events
        s2 = sb.fold(events, s)
        assert sb.decide(s2, command) == []

    def test_redelivered_create_and_resume(self) -> None:
        c = create()
        s = sb.fold(sb.decide(None, c))
        assert sb.decide(s, c) == []
        r = sb.ResumeSandbox(sandbox_id=SID)
        p = step(paused(), r)
        assert p is not None and sb.decide(p, r) == []
        with pytest.raises(Conflict):
            sb.decide(s, create())  # another create of the same id

    def test_recent_commands_are_bounded(self) -> None:
        s = running()
        for i in range(sb.RECENT_COMMANDS + 5):
            s = step(s, sb.SetSandboxTimeout(sandbox_id=SID, at=at(i), timeout_s=100 + i))
        assert s is not None and len(s.recent_commands) == sb.RECENT_COMMANDS

    def test_command_for_another_sandbox(self) -> None:
        with pytest.raises(Invalid):
            sb.decide(running(), sb.PauseSandbox(sandbox_id="other"))

    def test_rejection_changes_nothing(self) -> None:
        from domain import CommandRejected

        s = running()
        r = CommandRejected(
            aggregate_id=SID,
            command_id=uuid4(),
            command_type="PauseSandbox",
            code="conflict",
            reason="x",
            at=T0,
        )
        assert sb.evolve(s, r) is s
        assert sb.evolve(None, r) is None


class TestEvolve:
    def test_event_before_requested_is_corrupt(self) -> None:
        with pytest.raises(CorruptHistory):
            sb.evolve(None, sb.SandboxKilled(sandbox_id=SID, at=T0))

    def test_requested_twice_is_corrupt(self) -> None:
        [e] = sb.decide(None, create())
        with pytest.raises(CorruptHistory):
            sb.fold([e, e])

    def test_foreign_event_is_corrupt(self) -> None:
        from domain.template import TemplateDeleted

        with pytest.raises(CorruptHistory):
            sb.evolve(running(), TemplateDeleted(template_id="t", at=T0))

    def test_public_state(self) -> None:
        assert sb.public_state(S.RUNNING) == "running"
        assert sb.public_state(S.FORKING) == "running"
        assert sb.public_state(S.PAUSED) == "paused"
        assert sb.public_state(S.RESUMING) == "paused"
        assert sb.public_state(S.CREATING) is None
        assert sb.public_state(S.KILLED) is None

    def test_ids(self) -> None:
        a, b = sb.new_sandbox_id(), sb.new_sandbox_id()
        assert a != b and len(a) == 20
        assert sb.derived_command_id("a", "b") == sb.derived_command_id("a", "b")


class TestFilesystemPause:
    """E2B's `pause(keep_memory=False)`: the request and the node's answer both say so."""

    def test_request_and_outcome_carry_memory(self) -> None:
        s = running()
        [req] = sb.decide(s, sb.PauseSandbox(sandbox_id=SID, at=at(11), keep_memory=False))
        assert isinstance(req, sb.SandboxPauseRequested) and req.keep_memory is False
        s2 = sb.fold([req], s)
        done = sb.CompletePause(sandbox_id=SID, at=at(12), snapshot_id="p1", memory=False)
        [e] = sb.decide(s2, done)
        assert isinstance(e, sb.SandboxPaused) and e.memory is False
        p = sb.fold([e], s2)
        assert p is not None and p.status is S.PAUSED

    def test_default_keeps_memory(self) -> None:
        [req] = sb.decide(running(), sb.PauseSandbox(sandbox_id=SID, at=at(11)))
        assert isinstance(req, sb.SandboxPauseRequested) and req.keep_memory is True

    def test_old_events_without_the_field_read_as_memory_pauses(self) -> None:
        """Event logs written before the field existed must fold the same way."""
        raw = {"sandbox_id": SID, "at": at(12).isoformat(), "remaining_s": 3.0, "snapshot_id": "p1"}
        assert sb.SandboxPaused.model_validate(raw).memory is True
