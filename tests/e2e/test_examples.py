"""examples/ run as a user runs them: a subprocess with only the E2B settings of the
stack, the unchanged SDK, and the JSON line each prints checked for what it claims."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import Stack

pytestmark = pytest.mark.vm

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(stack: Stack, script: str, *args: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **stack.env()},
        cwd=EXAMPLES,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_best_of_n_forks_one_prepared_state_and_scores_each_branch(stack: Stack) -> None:
    out = _run(stack, "best_of_n.py", "4")
    branches = out["branches"]
    assert isinstance(branches, list) and len(branches) == 4, out
    assert out["failed_forks"] == []
    assert len({b["sandbox"] for b in branches}) == 4
    # each branch ran its own answer over the same prepared file: the rewards differ
    # exactly as the answers do (the correct median scores 1.0, the unchanged bug less)
    rewards = {b["answer"]: b["reward"] for b in branches}
    assert rewards["return xs[len(xs) // 2]"] < 1.0
    assert max(rewards.values()) == 1.0
    assert out["best"] == {"answer": max(rewards, key=rewards.__getitem__), "reward": 1.0}
    assert out["root_untouched"] is True


def test_think_pause_keeps_the_episode_s_process_and_files_across_pauses(stack: Stack) -> None:
    out = _run(stack, "think_pause.py", "3")
    steps = out["steps"]
    assert isinstance(steps, list) and len(steps) == 3, out
    assert [s["actions_logged"] for s in steps] == [1, 2, 3]
    counters = [s["counter"] for s in steps]
    # the first step's process kept counting across every pause: never reset, never lost
    assert counters == sorted(counters) and counters[0] > 0 and len(set(counters)) == 3
    assert str(out["sandbox"]) not in _aenv_ls(stack)  # killed at the end


def _aenv_ls(stack: Stack) -> str:
    listed = subprocess.run(
        [sys.executable, "-m", "aenv.cli", "ls", "-o", "json"],
        capture_output=True,
        text=True,
        env={**os.environ, **stack.env()},
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    return listed.stdout


def test_swe_loop_scores_each_episode_in_a_fresh_sandbox_under_one_lease(stack: Stack) -> None:
    out = _run(stack, "swe_loop.py", "4", "2")
    episodes = out["episodes"]
    assert isinstance(episodes, list) and len(episodes) == 4, out
    assert out["concurrency"] == 2
    # the graders ran each task's tests over the agent's patch: the right patches score 1,
    # the unchanged bug of `clamp` does not (its reward is that of the bug, 2 of 3 cases)
    rewards = {(e["task"], e["patch"]): e["reward"] for e in episodes}
    assert rewards[("clamp", "def clamp(x, lo, hi):\n    return min(hi, max(lo, x))\n")] == 1.0
    assert rewards[("clamp", "def clamp(x, lo, hi):\n    return max(lo, x)\n")] < 1.0
    assert rewards[("is_even", "def is_even(n):\n    return n % 2 == 0\n")] == 1.0
    # every episode killed its agent and its grader; the lease held nothing at its end
    assert out["held_after"] == 0 and out["killed_at_end"] == 0, out
    assert str(out["lease"]) not in _aenv_ls(stack)


def test_code_rewards_scores_each_candidate_in_a_namespace_of_its_own(stack: Stack) -> None:
    out = _run(stack, "code_rewards.py", "2")
    assert out["sandboxes"] == 2 and out["runs"] == 6, out
    rewards = {(r["problem"], r["candidate"]): r["reward"] for r in out["rewards"]}
    # the right solutions pass all, the wrong ones fewer, the raising and looping ones none
    assert rewards == {
        ("fib", 0): 1.0,
        ("fib", 1): 0.5,  # only fib(0) and fib(1) match: the +1 compounds past them
        ("fib", 2): 0.0,
        ("rev_words", 0): 1.0,
        ("rev_words", 1): 2 / 3,  # 'one' reversed is 'eno'; '' and 'a b c' → 'c b a' agree
        ("rev_words", 2): 0.0,
    }, rewards
