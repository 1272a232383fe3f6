"""Harbor benchmark: Harbor's own per-phase times (environment setup, agent setup, agent,
verifier) and whole-run wall time for `harbor run -a oracle -e e2b` against a real `aenv up`
stack at 1 and at 8 concurrent trials, from one run, next to the same work done directly
with the e2b SDK at the same concurrency (the raw primitive: what Harbor adds on top of
aenv).

One stack, one set of images (tests/harbor.py's: the four tasks of
tests/e2e/test_harbor.py, on a registry on loopback), then:

1. a warm-up `harbor run -n 4 -k 1`: it builds the four task templates (Harbor names each
   after its task and environment hash, and builds only when the alias is missing), so the
   two measured passes both find their templates built — an RL loop's steady state, where
   a template is built once and rolled out many times. Its figures are reported beside
   the others (its environment setup is the build);
2. `harbor run -n 1 -k A` and the raw SDK pass at concurrency 1;
3. `harbor run -n 8 -k A` and the raw SDK pass at concurrency 8;

T = 4 tasks x A attempts trials a pass (A = 2: 8 trials). The builds each pass made are
counted from the API (`GET /templates`, each template's `buildCount`), so a pass that built
anything shows it. A raw trial does what Harbor's oracle trial does to the sandbox:
`AsyncSandbox.create` from the task's template, the log directories made, the solution
written and run (the internet off around it for the `no-network` task, as Harbor does), the
test written and run, the reward read, the sandbox killed — every reward must be 1 on both
sides. Run as root: `python -m bench.harbor_bench [--attempts 2]`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.stats import emit, ratio, summary
from tests.harbor import (
    HARBOR,
    MIN_FREE_BYTES,
    PHASES,
    TASKS,
    failure,
    harbor_env,
    phase_seconds,
    task_images,
    write_tasks,
)
from tests.registry import local_registry
from tests.support import tagged
from tests.vmstack import SDK_ENV, running_stack

CONCURRENCY = (1, 8)
#: the raw trial's phases, named after the Harbor phase each stands beside
RAW_PHASES = ("environment_setup", "agent_execution", "verifier", "teardown")


def _say(message: str) -> None:
    print(f"harbor_bench: {message}", file=sys.stderr, flush=True)


def _builds(api: str, key: str) -> int:
    """Builds of the team's own templates so far (the built-in ones left out)."""
    import httpx

    r = httpx.get(f"{api}/templates", headers={"X-API-KEY": key}, timeout=30)
    r.raise_for_status()
    return sum(t["buildCount"] for t in r.json() if not t["public"])


def _aliases(api: str, key: str) -> dict[str, str]:
    """Each task's template alias, as Harbor named it (`<task>__<environment hash>`)."""
    import httpx

    r = httpx.get(f"{api}/templates", headers={"X-API-KEY": key}, timeout=30)
    r.raise_for_status()
    names = [a for t in r.json() for a in t["aliases"]]
    return {task: next(a for a in names if a.startswith(f"{task}__")) for task in TASKS}


@dataclass
class Pass:
    wall_s: float
    job_s: float | None
    builds: int
    trials: list[dict[str, Any]]


def _harbor(work: Path, env: dict[str, str], name: str, n: int, attempts: int) -> Pass:
    """One `harbor run`; every trial must score 1."""
    api, key = env["E2B_API_URL"], env["E2B_API_KEY"]
    before = _builds(api, key)
    argv = [str(HARBOR), "run", "-p", str(work / "tasks"), "-a", "oracle", "-e", "e2b"]
    argv += ["-n", str(n), "-k", str(attempts), "-y", "-o", str(work / "jobs")]
    t0 = time.monotonic()
    run = subprocess.run(
        [*argv, "--job-name", name],
        env=harbor_env(env),
        cwd=work,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    wall = time.monotonic() - t0
    job = work / "jobs" / name
    trials = [json.loads(p.read_text()) for p in sorted(job.glob("*/result.json"))]
    bad = {
        r["trial_name"]: failure(r)
        for r in trials
        if (r.get("verifier_result") or {}).get("rewards") != {"reward": 1}
    }
    if run.returncode != 0 or bad or len(trials) != len(TASKS) * attempts:
        raise SystemExit(
            f"harbor run {name}: exit {run.returncode}, {len(trials)} trials, failed {bad}\n"
            f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
        )
    summary_file = job / "result.json"
    job_s = phase_seconds(json.loads(summary_file.read_text())) if summary_file.exists() else None
    return Pass(wall, job_s, _builds(api, key) - before, trials)


def _harbor_stats(p: Pass) -> dict[str, Any]:
    out: dict[str, Any] = {
        "trials": len(p.trials),
        "builds": p.builds,
        "wall_s": round(p.wall_s, 3),
        "job_s": None if p.job_s is None else round(p.job_s, 3),
        "trial_s": summary([phase_seconds(r) or 0.0 for r in p.trials], unit="s", scale=1.0),
    }
    for phase in PHASES:
        times = [phase_seconds(r.get(phase)) for r in p.trials]
        out[phase] = summary([t for t in times if t is not None], unit="s", scale=1.0)
    return out


def _raw_work(task_dir: Path) -> tuple[bytes, bytes, str | None, bool]:
    """A task's solution, test, working directory (its Dockerfile's WORKDIR, which Harbor
    passes as the cwd) and whether its agent runs with the internet off."""
    cwd = None
    dockerfile = task_dir / "environment" / "Dockerfile"
    if dockerfile.exists():
        for line in dockerfile.read_text().splitlines():
            if line.startswith("WORKDIR "):
                cwd = line.split(None, 1)[1]
    no_net = 'network_mode = "no-network"' in (task_dir / "task.toml").read_text()
    solve = (task_dir / "solution/solve.sh").read_bytes()
    return solve, (task_dir / "tests/test.sh").read_bytes(), cwd, no_net


async def _raw_trial(task_dir: Path, alias: str) -> dict[str, float]:
    from e2b import AsyncSandbox

    solve, test, cwd, no_net = _raw_work(task_dir)
    marks = [time.monotonic()]
    sbx = await AsyncSandbox.create(template=alias, timeout=3600)
    # as Harbor's ensure_dirs; the solution and tests are written as the SDK's default user
    logs = "/logs/agent /logs/verifier"
    await sbx.commands.run(f"mkdir -p {logs} && chmod 777 {logs}", user="root")
    marks.append(time.monotonic())
    if no_net:
        await sbx.update_network({"allow_internet_access": False})
    await sbx.files.write("/solution/solve.sh", solve)
    await sbx.commands.run("bash /solution/solve.sh", cwd=cwd, user="root")
    if no_net:
        await sbx.update_network({})
    marks.append(time.monotonic())
    await sbx.files.write("/tests/test.sh", test)
    await sbx.commands.run("bash /tests/test.sh", cwd=cwd, user="root")
    reward = await sbx.files.read("/logs/verifier/reward.txt")
    marks.append(time.monotonic())
    await sbx.kill()
    marks.append(time.monotonic())
    if reward.strip() != "1":
        raise SystemExit(f"raw trial of {task_dir.name}: reward {reward!r}")
    times = dict(zip(RAW_PHASES, (b - a for a, b in itertools.pairwise(marks)), strict=True))
    return {**times, "trial": marks[-1] - marks[0]}


async def _raw_pass(work: Path, aliases: dict[str, str], n: int, attempts: int) -> Any:
    gate = asyncio.Semaphore(n)

    async def one(task: str) -> dict[str, float]:
        async with gate:
            return await _raw_trial(work / "tasks" / task, aliases[task])

    t0 = time.monotonic()
    trials = await asyncio.gather(*(one(t) for _ in range(attempts) for t in TASKS))
    return time.monotonic() - t0, trials


def _raw_stats(wall: float, trials: list[dict[str, float]]) -> dict[str, Any]:
    out: dict[str, Any] = {"trials": len(trials), "wall_s": round(wall, 3)}
    out["trial_s"] = summary([t["trial"] for t in trials], unit="s", scale=1.0)
    for phase in RAW_PHASES:
        out[phase] = summary([t[phase] for t in trials], unit="s", scale=1.0)
    return out


def _versus(harbor: dict[str, Any], raw: dict[str, Any]) -> dict[str, Any]:
    """Harbor's figure over the raw one's: the whole run (`wall`: the `harbor` process, its
    start of some 2-3 s included; `job`: Harbor's own job timer), a trial, and each phase."""
    out: dict[str, Any] = {"wall": round(harbor["wall_s"] / raw["wall_s"], 3)}
    if harbor["job_s"] is not None:
        out["job"] = round(harbor["job_s"] / raw["wall_s"], 3)
    out["trial_p50"] = ratio(harbor["trial_s"], raw["trial_s"])
    for phase in ("environment_setup", "agent_execution", "verifier"):
        out[f"{phase}_p50"] = ratio(harbor[phase], raw[phase])
    return out


def run(work: Path, attempts: int) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    prefix = tagged("aenvh")
    env = {**os.environ, "AENV_SLOT_PREFIX": prefix, "AENV_NODE_ID": "hbench"}
    out: dict[str, Any] = {"harbor": "harbor[e2b]==0.25.0 (.venv-harbor)", "agent": "oracle"}
    with local_registry(work / "hub") as hub, running_stack(work / "stack", env, prefix) as up:
        stack_env = {k: up[k] for k in SDK_ENV}
        base, image = task_images(hub, work, tag)
        write_tasks(work / "tasks", base, image)
        _say("warm-up: harbor run -n 4 -k 1 (builds the four templates)")
        warm = _harbor(work, stack_env, f"warmup-{tag}", 4, 1)
        out["warmup_n4"] = _harbor_stats(warm)
        aliases = _aliases(stack_env["E2B_API_URL"], stack_env["E2B_API_KEY"])
        for n in CONCURRENCY:
            _say(f"harbor run -n {n} -k {attempts}")
            harbor = _harbor_stats(_harbor(work, stack_env, f"n{n}-{tag}", n, attempts))
            _say(f"raw e2b SDK, {n} at once")
            raw = _raw_stats(*asyncio.run(_raw_pass(work, aliases, n, attempts)))
            out[f"n{n}"] = {"harbor": harbor, "raw_sdk": raw, "harbor_vs_raw": _versus(harbor, raw)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--attempts", type=int, default=2, help="attempts per task (-k): 4 x A trials")
    args = p.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("harbor_bench: the stack runs microVMs: run as root")
    if not HARBOR.exists():
        _say(f"skipped: Harbor is not installed at {HARBOR} (scripts/setup.sh makes it)")
        return
    work = Path(tempfile.mkdtemp(prefix="aenv-harborbench-", dir="/var/tmp"))
    try:
        if shutil.disk_usage(work).free < MIN_FREE_BYTES:
            raise SystemExit("harbor_bench: under 2 GiB free for the task images")
        emit("harbor", {"attempts": args.attempts, **run(work, args.attempts)})
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
