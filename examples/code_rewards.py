"""Code-execution rewards with `e2b_code_interpreter`: many short stateless runs, as verl's
SandboxFusion reward does — each candidate program a model wrote runs against its
problem's tests, the share that pass is its reward.

A few sandboxes of `code-interpreter-v1` serve every run (the stack's nodes must serve that
template: `AENV_CODE_INTERPRETER=1`); each candidate runs in a namespace of its own, so one
candidate's globals never leak into the next, and a candidate that raises or loops is a
reward of 0, not a failed job (a loop is interrupted when its run times out).

    E2B_API_URL=... E2B_API_KEY=... python examples/code_rewards.py [SANDBOXES]

Prints one JSON line: each candidate's reward, and the runs' latency.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from e2b import TimeoutException
from e2b_code_interpreter import Sandbox

#: problem → (its tests as (call, expected) pairs, candidate solutions a model proposed)
PROBLEMS: dict[str, tuple[list[tuple[str, Any]], list[str]]] = {
    "fib": (
        [("fib(0)", 0), ("fib(1)", 1), ("fib(10)", 55), ("fib(20)", 6765)],
        [
            "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
            "    return a",
            "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2) + 1",
            "def fib(n):\n    raise NotImplementedError",
        ],
    ),
    "rev_words": (
        [("rev_words('a b c')", "c b a"), ("rev_words('one')", "one"), ("rev_words('')", "")],
        [
            "def rev_words(s):\n    return ' '.join(reversed(s.split()))",
            "def rev_words(s):\n    return s[::-1]",
            "def rev_words(s):\n    while True:\n        pass",
        ],
    ),
}
#: a candidate that runs longer than this scores 0 (loops, huge inputs)
RUN_TIMEOUT_S = 5.0


def score(sbx: Sandbox, candidate: str, tests: list[tuple[str, Any]]) -> float:
    """The share of `tests` `candidate` passes. The candidate runs in a namespace of its own
    (`exec` into a fresh dict) in the sandbox's warm kernel: no state from an earlier run
    is visible to it, and no new kernel is started per run."""
    checks = [f"({call}) == {expected!r}" for call, expected in tests]
    program = f"_ns = {{}}\nexec({candidate!r}, _ns)\nprint(sum(eval(c, _ns) for c in {checks!r}))"
    try:
        run = sbx.run_code(program, timeout=RUN_TIMEOUT_S)
    except TimeoutException:  # the candidate loops: the server interrupts the kernel
        return 0.0
    if run.error is not None or not run.logs.stdout:
        return 0.0
    return int("".join(run.logs.stdout).strip()) / len(tests)


def main(sandboxes: int) -> dict[str, Any]:
    jobs = [
        (problem, i, candidate, tests)
        for problem, (tests, candidates) in PROBLEMS.items()
        for i, candidate in enumerate(candidates)
    ]
    pool = [
        Sandbox.create(timeout=300, metadata={"example": "code-rewards"}) for _ in range(sandboxes)
    ]
    latencies: list[float] = []
    try:

        def run(k: int) -> dict[str, Any]:
            problem, i, candidate, tests = jobs[k]
            start = time.monotonic()
            reward = score(pool[k % len(pool)], candidate, tests)
            latencies.append(time.monotonic() - start)
            return {"problem": problem, "candidate": i, "reward": reward}

        with ThreadPoolExecutor(len(pool)) as workers:
            rewards = list(workers.map(run, range(len(jobs))))
    finally:
        for sbx in pool:
            sbx.kill()
    return {
        "sandboxes": len(pool),
        "runs": len(jobs),
        "rewards": rewards,
        "run_p50_s": round(statistics.median(latencies), 3),
        "run_max_s": round(max(latencies), 3),
    }


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)))
