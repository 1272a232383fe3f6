"""A role start never changes a stream's replicas (issue 30): the refusal names both
values and what to do, in either direction."""

from __future__ import annotations

from bus.setup import replicas_problem


def test_equal_replicas_are_no_problem() -> None:
    assert replicas_problem("AENV_EVT", 3, 3) is None


def test_lowering_is_refused_naming_both_values_and_the_fix() -> None:
    problem = replicas_problem("AENV_EVT", 3, 1)
    assert problem is not None
    assert problem.startswith(
        "stream AENV_EVT has 3 replicas, this role asks for 1: set AENV_REPLICAS=3"
    )
    assert "nats stream edit AENV_EVT --replicas 1" in problem


def test_raising_is_refused_too() -> None:
    problem = replicas_problem("T1_AENV_CMD", 1, 3)
    assert problem is not None and "has 1 replicas, this role asks for 3" in problem
