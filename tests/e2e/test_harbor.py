"""Harbor (PyPI `harbor`, the agent-benchmark and RL-rollout harness) runs its own E2B
environment against aenv, unchanged: `harbor run -e e2b` with the oracle agent, four trials
at once, every trial's reward read back from Harbor's own `result.json`.

The tasks cover what an RL user's tasks do through Harbor's `E2BEnvironment`:

- `dockerfile`: `environment/Dockerfile` FROM an image on a registry on loopback, with ENV,
  WORKDIR, COPY and RUN and no USER line (Harbor's tasks rarely set one; Docker's default is
  root), built by Harbor through `Template.from_dockerfile`;
- `prebuilt`: `[environment] docker_image`, an image the test pushes (`Template.from_image`),
  its ENV and WORKDIR the sandbox's defaults;
- `no-net-agent`: an `[agent] network_mode = "no-network"` override on a public baseline:
  Harbor turns the sandbox's internet off before the agent (`update_network`, E2B's
  `PUT /sandboxes/{id}/network`) and back on before the verifier;
- `plain`: a second Dockerfile task (a fourth template built at the same time).

Each verifier is a plain bash `tests/test.sh` writing `/logs/verifier/reward.txt`. Harbor
uploads the solution and tests as the SDK's default user and runs them as root; the
image is Debian-shaped (bash, coreutils and their libraries from this host), so nothing is
fetched from the internet. Harbor lives in a venv of its own (`.venv-harbor`, made by
`scripts/setup.sh`: it needs Python 3.12 and pins its own `e2b`), run as a subprocess with
its telemetry off and every stray request sent to a closed loopback port. The tasks, images
and Harbor's environment are tests/harbor.py's, shared with bench/harbor_bench.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.e2e.conftest import Stack
from tests.harbor import (
    HARBOR,
    MIN_FREE_BYTES,
    TASKS,
    failure,
    harbor_env,
    report,
    task_images,
    write_tasks,
)

pytestmark = pytest.mark.vm


def test_harbor_runs_oracle_trials_on_its_e2b_environment(stack: Stack, tmp_path: Path) -> None:
    if not HARBOR.exists():
        pytest.skip(f"Harbor is not installed at {HARBOR} (scripts/setup.sh makes .venv-harbor)")
    if shutil.disk_usage(tmp_path).free < MIN_FREE_BYTES:
        pytest.skip("under 2 GiB free for the task images")
    tag = uuid.uuid4().hex[:8]
    base, image = task_images(stack.hub, tmp_path, tag)
    tasks = tmp_path / "tasks"
    write_tasks(tasks, base, image)
    jobs, name = tmp_path / "jobs", f"aenv-{tag}"

    started = time.monotonic()
    argv = [str(HARBOR), "run", "-p", str(tasks), "-a", "oracle", "-e", "e2b", "-n", "4", "-y"]
    run = subprocess.run(
        [*argv, "-o", str(jobs), "--job-name", name],
        env=harbor_env(stack.env()),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    took = time.monotonic() - started
    results = [json.loads(p.read_text()) for p in sorted((jobs / name).glob("*/result.json"))]
    print(f"harbor run: {took:.0f}s, exit {run.returncode}\n{report(results)}")
    out = f"--- stdout\n{run.stdout[-3000:]}\n--- stderr\n{run.stderr[-3000:]}"
    assert run.returncode == 0, out
    assert sorted(r["task_name"] for r in results) == list(TASKS), out
    failed = {
        r["task_name"]: failure(r)
        for r in results
        if (r.get("verifier_result") or {}).get("rewards") != {"reward": 1}
    }
    assert failed == {}, f"{report(results)}\n{json.dumps(failed, indent=1)}\n{out}"
