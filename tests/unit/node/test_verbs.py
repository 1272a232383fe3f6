"""What a create's or resume's request, as the log decided it, leaves the node to do
(`workers/node/verbs.py`): the redelivery rules both handlers share, with no services."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import uuid4

import pytest

from domain import sandbox as sb
from domain.sandbox import SandboxStatus as S
from workers.node.verbs import Next, after_request, failed_meanwhile, killed_meanwhile

T0 = datetime(2024, 1, 1, tzinfo=UTC)
HERE, THERE = "node-a", "node-b"
#: the request each case is about
REQ = uuid4()


def _state(status: S, node_id: str | None) -> sb.Sandbox:
    create = sb.CreateSandbox(sandbox_id="s1", template_id="base", at=T0, node_id=node_id)
    [requested] = sb.decide(None, create)
    state = sb.evolve(None, requested)
    assert state is not None
    return state.model_copy(update={"status": status, "node_id": node_id})


class TestACreate:
    """A create claims its node: the log's node decides whose it is."""

    def test_decided_here_is_this_nodes_work(self) -> None:
        assert (
            after_request(_state(S.CREATING, HERE), S.CREATING, HERE, claims=True, request=REQ)
            is Next.WORK
        )

    def test_claimed_by_another_node_is_watched(self) -> None:
        got = after_request(_state(S.CREATING, THERE), S.CREATING, HERE, claims=True, request=REQ)
        assert got is Next.TAKEN

    def test_withdrawn_by_an_api_is_watched_too(self) -> None:
        # the watch itself returns at once: the API records the failure
        got = after_request(_state(S.CREATING, None), S.CREATING, HERE, claims=True, request=REQ)
        assert got is Next.TAKEN

    def test_a_resume_under_way_for_another_request_is_not_this_ones(self) -> None:
        """A redelivery of a resume answered before its node died, arriving while a later
        request resumes the sandbox: that resume is the later request's work and answer."""
        later = _state(S.RESUMING, HERE).model_copy(update={"resuming_command": uuid4()})
        assert after_request(later, S.RESUMING, HERE, claims=False, request=REQ) is Next.NOTHING
        own = later.model_copy(update={"resuming_command": REQ})
        assert after_request(own, S.RESUMING, HERE, claims=False, request=REQ) is Next.WORK

    def test_redelivered_after_it_ran_here_reputs_the_route(self) -> None:
        got = after_request(_state(S.RUNNING, HERE), S.CREATING, HERE, claims=True, request=REQ)
        assert got is Next.REPUT

    @pytest.mark.parametrize(
        ("status", "node"),
        [(S.RUNNING, THERE), (S.KILLED, HERE), (S.FAILED, HERE), (S.PAUSED, HERE)],
    )
    def test_finished_otherwise_is_nothing(self, status: S, node: str) -> None:
        assert (
            after_request(_state(status, node), S.CREATING, HERE, claims=True, request=REQ)
            is Next.NOTHING
        )

    def test_no_sandbox_is_nothing(self) -> None:
        assert after_request(None, S.CREATING, HERE, claims=True, request=REQ) is Next.NOTHING


class TestAResume:
    """A resume names the node that took it in its request (for the fleet's timer), but
    claims nothing by it: resuming is this node's wherever the log has it."""

    def test_resuming_is_this_nodes_work(self) -> None:
        got = after_request(_state(S.RESUMING, THERE), S.RESUMING, HERE, claims=False, request=REQ)
        assert got is Next.WORK

    def test_redelivered_after_it_ran_here_reputs_the_route(self) -> None:
        got = after_request(_state(S.RUNNING, HERE), S.RESUMING, HERE, claims=False, request=REQ)
        assert got is Next.REPUT

    @pytest.mark.parametrize(
        ("status", "node"),
        [(S.RUNNING, THERE), (S.PAUSED, HERE), (S.KILLED, HERE), (S.CREATING, THERE)],
    )
    def test_anything_else_is_nothing(self, status: S, node: str) -> None:
        assert (
            after_request(_state(status, node), S.RESUMING, HERE, claims=False, request=REQ)
            is Next.NOTHING
        )


class TestKilledMeanwhile:
    @pytest.mark.parametrize("status", [S.KILLING, S.KILLED, S.FAILED])
    def test_a_vm_up_for_a_sandbox_that_ended_is_killed(self, status: S) -> None:
        assert killed_meanwhile(None, [], _state(status, HERE))

    def test_a_completion_that_was_decided_keeps_its_vm(self) -> None:
        assert not killed_meanwhile(None, [object()], _state(S.KILLED, HERE))

    def test_a_vm_that_did_not_come_up_has_nothing_to_kill(self) -> None:
        assert not killed_meanwhile("restore failed", [], _state(S.KILLED, HERE))

    def test_a_running_sandbox_keeps_its_vm(self) -> None:
        assert not killed_meanwhile(None, [], _state(S.RUNNING, HERE))
        assert not killed_meanwhile(None, [], None)


class TestFailedMeanwhile:
    """A resume the log failed while this node did it (the fleet's timer took the node for
    gone): the late completion decides nothing and the sandbox is paused again."""

    def _late(self) -> tuple[list[sb.SandboxEvent], sb.Sandbox]:
        """The real decision: the node's report after the timer's failure."""
        state = _state(S.RESUMING, HERE)
        failure = sb.CompleteResume(sandbox_id="s1", node_id=HERE, error="node gone", at=T0)
        state = sb.fold(sb.decide(state, failure), state)  # type: ignore[assignment]
        late = sb.CompleteResume(sandbox_id="s1", node_id=HERE, at=T0)
        return sb.decide(state, late), state

    def test_a_vm_up_for_a_resume_failed_meanwhile_is_undone(self) -> None:
        events, state = self._late()
        assert state.status is S.PAUSED and events == []
        assert failed_meanwhile(None, events, state)
        assert not killed_meanwhile(None, events, state)  # not a kill: the capture stays

    def test_a_vm_that_did_not_come_up_has_nothing_to_undo(self) -> None:
        events, state = self._late()
        assert not failed_meanwhile("restore failed", events, state)

    def test_a_recorded_resume_is_not_undone(self) -> None:
        assert not failed_meanwhile(None, [object()], _state(S.RUNNING, HERE))
        assert not failed_meanwhile(None, [], _state(S.KILLING, HERE))
        assert not failed_meanwhile(None, [], None)
