"""Every command against every lifecycle state: the events it decides, or the error it raises.

The table *is* the specification of design §4; a new state or command must add a column/row.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from domain import Conflict, NotFound
from domain import sandbox as sb
from tests.unit.domain.builders import SID, STATES, at, create

NF, C, NONE = NotFound, Conflict, "no events"

COMMANDS: dict[str, Callable[[], sb.SandboxCommand]] = {
    "create": lambda: create(),
    "pause": lambda: sb.PauseSandbox(sandbox_id=SID, at=at(50)),
    "resume": lambda: sb.ResumeSandbox(sandbox_id=SID, at=at(50)),
    "kill": lambda: sb.KillSandbox(sandbox_id=SID, at=at(50)),
    "set_timeout": lambda: sb.SetSandboxTimeout(sandbox_id=SID, at=at(50), timeout_s=30),
    "fork": lambda: sb.ForkSandbox(sandbox_id=SID, at=at(50), count=2),
    "snapshot": lambda: sb.SnapshotSandbox(sandbox_id=SID, at=at(50), snapshot_id="s:1"),
    "update_network": lambda: sb.UpdateSandboxNetwork(
        sandbox_id=SID, at=at(50), deny_out=("0.0.0.0/0",)
    ),
    "complete_create": lambda: sb.CompleteCreate(sandbox_id=SID, at=at(50), node_id="n1"),
    "complete_pause": lambda: sb.CompletePause(sandbox_id=SID, at=at(50)),
    "complete_resume": lambda: sb.CompleteResume(sandbox_id=SID, at=at(50), node_id="n2"),
    "complete_kill": lambda: sb.CompleteKill(sandbox_id=SID, at=at(50)),
    "complete_fork": lambda: sb.CompleteFork(sandbox_id=SID, at=at(50), children=()),
    "complete_snapshot": lambda: sb.CompleteSnapshot(
        sandbox_id=SID, at=at(50), snapshot_id="snap:v1"
    ),
}

_STATE_ORDER = [
    "none",
    "creating",
    "running",
    "pausing",
    "paused",
    "resuming",
    "snapshotting",
    "forking",
    "killing",
    "killed",
    "failed",
]

NU = sb.SandboxNetworkUpdated
KR, PR, RR, TS = (
    sb.SandboxKillRequested,
    sb.SandboxPauseRequested,
    sb.SandboxResumeRequested,
    sb.SandboxTimeoutSet,
)

# Columns follow _STATE_ORDER.
MATRIX: dict[str, list[object]] = {
    "create": [sb.SandboxRequested, C, C, C, C, C, C, C, C, C, C],
    "pause": [NF, C, PR, NONE, NONE, C, C, C, C, NF, C],
    "resume": [NF, C, C, C, RR, C, C, C, C, NF, C],
    "kill": [NF, KR, KR, KR, KR, KR, KR, KR, NONE, NF, KR],
    "set_timeout": [NF, C, TS, C, TS, C, TS, TS, C, NF, C],
    "fork": [NF, C, sb.SandboxForkRequested, C, C, C, C, C, C, NF, C],
    "snapshot": [NF, C, sb.SnapshotRequested, C, C, C, C, C, C, NF, C],
    "update_network": [NF, C, NU, C, C, C, NU, NU, C, NF, C],
    "complete_create": [NF, sb.SandboxCreated, C, C, C, C, C, C, NONE, NONE, NONE],
    "complete_pause": [NF, C, C, sb.SandboxPaused, C, C, C, C, NONE, NONE, NONE],
    "complete_resume": [NF, C, C, C, NONE, sb.SandboxResumed, C, C, NONE, NONE, NONE],
    "complete_kill": [NF, C, C, C, C, C, C, C, sb.SandboxKilled, NONE, NONE],
    "complete_fork": [NF, C, C, C, C, C, C, sb.SandboxForked, NONE, NONE, NONE],
    "complete_snapshot": [NF, C, C, C, C, C, sb.SnapshotTaken, C, NONE, NONE, NONE],
}

CASES = [
    pytest.param(cmd, state, expected, id=f"{cmd}@{state}")
    for cmd, row in MATRIX.items()
    for state, expected in zip(_STATE_ORDER, row, strict=True)
]


def test_matrix_covers_every_command_and_state() -> None:
    assert set(MATRIX) == set(COMMANDS)
    assert set(_STATE_ORDER) == {"none", *STATES}


@pytest.mark.parametrize(("command", "state_name", "expected"), CASES)
def test_decide(command: str, state_name: str, expected: object) -> None:
    state = None if state_name == "none" else STATES[state_name]()
    cmd = COMMANDS[command]()
    if isinstance(expected, type) and issubclass(expected, Exception):
        with pytest.raises(expected):
            sb.decide(state, cmd)
        return
    events = sb.decide(state, cmd)
    if expected == NONE:
        assert events == []
        return
    assert [type(e) for e in events] == [expected]
    assert all(e.sandbox_id == SID and e.at == cmd.at for e in events)
    # every decided event folds: evolve is total over what decide produces
    after = sb.fold(events, state)
    assert after is not None
