"""A SWE-style rollout loop: one sandbox per episode from its task's image, a few episodes
at a time, the reward tests in a fresh sandbox, every sandbox under one lease.

Each task names its image (a template: `base` here; in a real job one image per task, e.g.
`aenv pull` of the task's registry image) and a repository with a failing test. An
episode's "agent" (a scripted policy standing in for the model) edits the repository in its
own sandbox; the patch is then applied to a *fresh* sandbox of the same image where the
task's tests run, so nothing the agent left behind can fake a pass. Episodes run
`--concurrency` at a time, as trainers pace their creates.

The lease is the job's dead-man switch (docs/leases.md): every sandbox is created under it,
a background thread renews it, and if this process dies the stack kills them all within the
lease's TTL. At the end the lease is ended, which kills whatever is left in one call.

    E2B_API_URL=... E2B_API_KEY=... python examples/swe_loop.py [EPISODES] [CONCURRENCY]

Prints one JSON line: each episode's task, patch and reward, and what the lease held.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from e2b import Sandbox

#: (image, the buggy module, its test): the test prints the share of cases that pass
TASKS: list[dict[str, str]] = [
    {
        "name": "clamp",
        "image": "base",
        "module": "def clamp(x, lo, hi):\n    return max(lo, x)\n",
        "test": (
            "from task import clamp\n"
            "cases = [((5, 0, 3), 3), ((-1, 0, 3), 0), ((2, 0, 3), 2)]\n"
            "print(sum(clamp(*a) == w for a, w in cases) / len(cases))\n"
        ),
    },
    {
        "name": "is_even",
        "image": "base",
        "module": "def is_even(n):\n    return n % 2 == 1\n",
        "test": (
            "from task import is_even\n"
            "cases = [(2, True), (3, False), (0, True), (7, False)]\n"
            "print(sum(is_even(a) == w for a, w in cases) / len(cases))\n"
        ),
    },
]
#: what the policy writes, per task, by episode (a model would propose these)
PATCHES: dict[str, list[str]] = {
    "clamp": [
        "def clamp(x, lo, hi):\n    return min(hi, max(lo, x))\n",
        "def clamp(x, lo, hi):\n    return max(lo, x)\n",
    ],
    "is_even": [
        "def is_even(n):\n    return n % 2 == 0\n",
        "def is_even(n):\n    return not n & 1 == 1\n",
    ],
}
LEASE_TTL_S = 30
REPO = "/home/user/repo"


class Lease:
    """The job's lease, renewed every third of its TTL until `end`."""

    def __init__(self, api: httpx.Client, ttl: int) -> None:
        self.api = api
        r = api.post("/leases", json={"ttl": ttl})
        r.raise_for_status()
        self.id: str = r.json()["leaseID"]
        self._stop = threading.Event()
        self._renewer = threading.Thread(target=self._renew, args=(ttl / 3,), daemon=True)
        self._renewer.start()

    def _renew(self, every: float) -> None:
        while not self._stop.wait(every):
            self.api.post(f"/leases/{self.id}/renew").raise_for_status()

    def held(self) -> int:
        return int(self.api.get(f"/leases/{self.id}").json()["sandboxes"])

    def end(self) -> dict[str, Any]:
        """Stop renewing and end it: whatever of the job still runs is killed."""
        self._stop.set()
        self._renewer.join()
        r = self.api.delete(f"/leases/{self.id}")
        r.raise_for_status()
        return dict(r.json())


def _sandbox(task: dict[str, str], lease: Lease, role: str, episode: int) -> Sandbox:
    meta = {"aenv.lease": lease.id, "task": task["name"], "role": role, "episode": str(episode)}
    return Sandbox.create(task["image"], timeout=300, metadata=meta)


def episode(lease: Lease, n: int) -> dict[str, Any]:
    """One episode: the agent patches the task in its sandbox, a fresh one scores it."""
    task = TASKS[n % len(TASKS)]
    agent = _sandbox(task, lease, "agent", n)
    try:
        agent.files.write(f"{REPO}/task.py", task["module"])
        agent.files.write(f"{REPO}/test_task.py", task["test"])
        patch = PATCHES[task["name"]][(n // len(TASKS)) % len(PATCHES[task["name"]])]
        agent.files.write(f"{REPO}/task.py", patch)  # the agent's edit
        edited = agent.files.read(f"{REPO}/task.py")
    finally:
        agent.kill()
    grader = _sandbox(task, lease, "grader", n)  # the reward tests: a clean sandbox
    try:
        grader.files.write(f"{REPO}/task.py", edited)
        grader.files.write(f"{REPO}/test_task.py", task["test"])
        out = grader.commands.run(f"cd {REPO} && python3 test_task.py", timeout=60)
        reward = float(out.stdout.strip())
    finally:
        grader.kill()
    return {"episode": n, "task": task["name"], "patch": patch, "reward": reward}


def main(episodes: int, concurrency: int) -> dict[str, Any]:
    api = httpx.Client(
        base_url=os.environ["E2B_API_URL"],
        headers={"X-API-KEY": os.environ["E2B_API_KEY"]},
        timeout=60,
    )
    lease = Lease(api, LEASE_TTL_S)
    try:
        with ThreadPoolExecutor(concurrency) as pool:
            results = list(pool.map(lambda n: episode(lease, n), range(episodes)))
        held_after = lease.held()  # every episode killed its own sandboxes
    finally:
        ended = lease.end()  # and anything an episode left (a crash) goes here
    return {
        "lease": lease.id,
        "concurrency": concurrency,
        "episodes": results,
        "held_after": held_after,
        "killed_at_end": ended["count"],
    }


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:3]]
    print(json.dumps(main(*(args + [4, 2][len(args) :]))))
