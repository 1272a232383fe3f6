"""Best-of-N from one prepared state: set a task up once, fork it into N rollouts, let
each try its own answer, score each with the task's own test, keep the best.

The expensive part of an episode (the repository cloned, dependencies installed, the
agent's first steps) is done once; `fork` gives each branch that exact state — files,
running processes, memory — copy-on-write, in about the time of a pause.

    E2B_API_URL=... E2B_API_KEY=... python examples/best_of_n.py [N]

Prints one JSON line: each branch's answer and reward, and the winner.
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor

from e2b import Sandbox

TASK = """
def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]   # wrong for even lengths
"""
TEST = """
from task import median
cases = [([1], 1), ([3, 1, 2], 2), ([4, 1, 3, 2], 2.5), ([5, 5, 1, 9], 5), ([7, 8], 7.5)]
print(sum(median(list(xs)) == want for xs, want in cases) / len(cases))
"""
#: what each branch's "policy" proposes as the function's last line (a model would)
ANSWERS = [
    "    return xs[len(xs) // 2]",
    "    return xs[(len(xs) - 1) // 2]",
    "    n = len(xs); return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2",
    "    return sum(xs) / len(xs)",
]


def rollout(branch: Sandbox, answer: str) -> float:
    """One branch: apply its answer over the prepared task, run the test, read the reward."""
    lines = branch.files.read("/home/user/task.py").splitlines()
    branch.files.write("/home/user/task.py", "\n".join([*lines[:-1], answer]) + "\n")
    out = branch.commands.run("cd /home/user && python3 test_task.py", timeout=60)
    return float(out.stdout.strip())


def main(n: int) -> dict[str, object]:
    root = Sandbox.create(timeout=300, metadata={"example": "best-of-n"})
    branches: list[Sandbox] = []
    try:
        # the prepared state every branch starts from
        root.files.write("/home/user/task.py", TASK.lstrip("\n"))
        root.files.write("/home/user/test_task.py", TEST.lstrip("\n"))
        results = root.fork(count=n, timeout=300)
        branches = [r for r in results if isinstance(r, Sandbox)]
        failed = [repr(r) for r in results if not isinstance(r, Sandbox)]
        answers = [ANSWERS[i % len(ANSWERS)] for i in range(len(branches))]
        with ThreadPoolExecutor(4) as pool:
            rewards = list(pool.map(rollout, branches, answers))
        best = max(range(len(rewards)), key=rewards.__getitem__)
        # the root is untouched by its branches
        untouched = root.files.read("/home/user/task.py") == TASK.lstrip("\n")
        return {
            "branches": [
                {"sandbox": b.sandbox_id, "answer": a.strip(), "reward": r}
                for b, a, r in zip(branches, answers, rewards, strict=True)
            ],
            "failed_forks": failed,
            "best": {"answer": answers[best].strip(), "reward": rewards[best]},
            "root_untouched": untouched,
        }
    finally:
        for sbx in [*branches, root]:
            sbx.kill()


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 4)))
