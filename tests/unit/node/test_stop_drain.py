"""The node's drain on SIGTERM (`workers/node/stopdrain.py`, `AENV_STOP_DRAIN=pause`): what
it pauses and when it is done, and how long the role's stop may then take."""

from __future__ import annotations

import pytest

from aenv.roles.common import RoleSettings
from aenv.serve import NODE_TEARDOWN_S, stop_deadline_s
from domain import sandbox as sb
from domain.sandbox import SandboxStatus as S
from workers.node.stopdrain import tally

ME = "n1"


def _state(status: S, *, node: str = ME, paused: str | None = None, durable: str | None = None):  # type: ignore[no-untyped-def]
    return sb.Sandbox.model_construct(
        sandbox_id="x",
        status=status,
        node_id=node,
        paused_snapshot_id=paused,
        durable_snapshot_id=durable,
    )


def test_running_sandboxes_are_paused_and_the_drain_waits_for_their_upload() -> None:
    now = tally(
        ME,
        [
            ("run", _state(S.RUNNING)),
            ("pausing", _state(S.PAUSING)),
            ("uploading", _state(S.PAUSED, paused="p1", durable="p0")),
            ("durable", _state(S.PAUSED, paused="p1", durable="p1")),
        ],
        durable=True,
    )
    assert now.to_pause == ("run",)
    assert (now.done, now.total, now.finished) == (1, 4, False)


def test_ended_moved_and_unknown_sandboxes_are_done_with() -> None:
    now = tally(
        ME,
        [
            ("killed", _state(S.KILLED)),
            ("failed", _state(S.FAILED)),
            ("moved", _state(S.RUNNING, node="n2")),  # resumed elsewhere since
            ("gone", None),
        ],
        durable=True,
    )
    assert now.to_pause == () and now.finished


def test_without_a_repository_paused_is_as_far_as_it_goes() -> None:
    now = tally(ME, [("a", _state(S.PAUSED, paused="p1"))], durable=False)
    assert now.finished
    assert not tally(ME, [("a", _state(S.PAUSED, paused="p1"))], durable=True).finished


def test_nothing_held_is_done_at_once() -> None:
    assert tally(ME, [], durable=True).finished


@pytest.mark.parametrize(
    ("role", "mode", "expected"),
    [
        ("node", "pause", 30 + 300 + NODE_TEARDOWN_S),
        ("node", "off", 30 + NODE_TEARDOWN_S),
        ("api", "pause", 30),
    ],
)
def test_the_stop_deadline_holds_the_pause_drain_of_a_node_only(
    role: str, mode: str, expected: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AENV_STOP_DRAIN", mode)
    monkeypatch.setenv("AENV_STOP_DRAIN_S", "300")
    monkeypatch.setenv("AENV_DRAIN_S", "30")
    assert stop_deadline_s(role, RoleSettings()) == expected


def test_the_default_is_today_s_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AENV_STOP_DRAIN", raising=False)
    assert RoleSettings().stop_drain == "off"


class _Down:
    """A bus whose every call fails, as with NATS gone along with the host."""

    def __getattr__(self, name: str) -> object:
        def fail(*args: object, **kwargs: object) -> None:
            raise ConnectionError("nats: no servers available")

        return self if name in ("node_orders", "sandboxes", "commands") else fail


async def test_a_drain_that_cannot_reach_the_bus_leaves_the_stop_as_it_was() -> None:
    from typing import cast

    from bus import Bus
    from workers.node.stopdrain import StopDrain

    said: list[str] = []
    drain = StopDrain(
        cast(Bus, _Down()), ME, lambda: ["a"], durable=True, grace_s=5, say=said.append
    )
    assert await drain.run() is None
    assert said == []
