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
its telemetry off and every stray request sent to a closed loopback port.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest

from tests.e2e.conftest import Stack
from tests.registry import debian_tree, layout, push

pytestmark = pytest.mark.vm

HARBOR = Path(__file__).resolve().parents[2] / ".venv-harbor" / "bin" / "harbor"
#: what Harbor's scripts and aenv's build steps call in the guest
PROGRAMS = ("bash", "cat", "mkdir", "chmod", "rm", "ls", "id", "env", "cp", "touch", "tar")
#: a closed port: any request that ignored NO_PROXY fails here, on the machine
CLOSED = "http://127.0.0.1:9"
PHASES = ("environment_setup", "agent_setup", "agent_execution", "verifier")
#: the images are a few MiB; each of the four templates captures ~120 MiB (measured)
MIN_FREE_BYTES = 2 << 30

#: plain bash, no uv or pip (Harbor's own task template installs uv from the internet)
REWARD_IF = """#!/bin/bash
expected=$(cat <<'EOF'
{expected}
EOF
)
if [ "$(cat {answer})" = "$expected" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
echo "answer: $(cat {answer} 2>&1)"
"""


def _task(root: Path, name: str, toml: str, solve: str, answer: str, expected: str) -> Path:
    task = root / name
    (task / "solution").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "task.toml").write_text(
        'schema_version = "1.4"\n\n[verifier]\ntimeout_sec = 300.0\n\n'
        f"[agent]\ntimeout_sec = 300.0\n{toml}"
    )
    (task / "instruction.md").write_text(f"Write {answer}.\n")
    (task / "solution/solve.sh").write_text(f"#!/bin/bash\nset -euo pipefail\n{solve}")
    (task / "tests/test.sh").write_text(REWARD_IF.format(answer=answer, expected=expected))
    return task


def _dockerfile_task(root: Path, name: str, base: str) -> None:
    task = _task(
        root,
        name,
        "\n[environment]\n",
        "cat /app/data.txt /app/built.txt > answer.txt\n"
        'echo "$TASK_GREETING $(pwd)" >> answer.txt\n',
        "/app/answer.txt",
        f"copied into {name}\nbuilt by RUN\nhello /app",
    )
    env = task / "environment"
    env.mkdir()
    (env / "data.txt").write_text(f"copied into {name}\n")
    (env / "Dockerfile").write_text(
        f"FROM {base}\n"
        "ENV TASK_GREETING=hello\n"
        "WORKDIR /app\n"
        "COPY data.txt /app/data.txt\n"
        "RUN echo 'built by RUN' > /app/built.txt && chmod 644 /app/built.txt\n"
    )


def _prebuilt_task(root: Path, name: str, image: str, agent: str = "") -> None:
    _task(
        root,
        name,
        f'{agent}\n[environment]\ndocker_image = "{image}"\n',
        'echo "$PUZZLE_SEED $(cat /opt/puzzle/input.txt) $(pwd)" > /opt/puzzle/answer.txt\n',
        "/opt/puzzle/answer.txt",
        "41 forty-two /srv",
    )


def _images(stack: Stack, tmp_path: Path, tag: str) -> tuple[str, str]:
    """A Debian-shaped base (no USER) for the Dockerfiles, and a prebuilt task image on it
    with ENV, WORKDIR and a file of its own; both on the stack's loopback registry."""
    if shutil.disk_usage(tmp_path).free < MIN_FREE_BYTES:
        pytest.skip("under 2 GiB free for the task images")
    base = debian_tree(tmp_path / "tree", *PROGRAMS)
    extra = tmp_path / "extra"
    (extra / "opt/puzzle").mkdir(parents=True)
    (extra / "opt/puzzle/input.txt").write_text("forty-two\n")
    (extra / "srv").mkdir()
    config: dict[str, object] = {"config": {"Env": ["PUZZLE_SEED=41"], "WorkingDir": "/srv"}}
    base_ref = push(layout(tmp_path / "base-img", base), stack.hub, "tests/harbor-base", tag)
    task_ref = push(
        layout(tmp_path / "task-img", base, extra, config=config),
        stack.hub,
        "tests/harbor-task",
        tag,
    )
    for made in ("tree", "extra", "base-img", "task-img"):
        shutil.rmtree(tmp_path / made)
    return base_ref, task_ref


def _harbor_env(stack: Stack) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(stack.env())
    env.update(HARBOR_TELEMETRY="0", LITELLM_LOCAL_MODEL_COST_MAP="True")
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[var] = env[var.lower()] = CLOSED
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    return env


def _seconds(phase: dict[str, str] | None) -> float | None:
    if not phase or not phase.get("started_at") or not phase.get("finished_at"):
        return None
    start, end = (datetime.fromisoformat(phase[k]) for k in ("started_at", "finished_at"))
    return round((end - start).total_seconds(), 1)


def _report(results: list[dict[str, object]]) -> str:
    lines = [f"{'task':<14}" + "".join(f"{p:>19}" for p in PHASES) + "  rewards"]
    for r in sorted(results, key=lambda r: str(r["task_name"])):
        times = [_seconds(r.get(p)) for p in PHASES]  # type: ignore[arg-type]
        rewards = (r.get("verifier_result") or {}).get("rewards")  # type: ignore[union-attr]
        lines.append(
            f"{r['task_name']!s:<14}"
            + "".join(f"{'-' if t is None else f'{t:.1f}s':>19}" for t in times)
            + f"  {rewards}"
        )
    return "\n".join(lines)


def _why(result: dict[str, object]) -> object:
    """A failed trial in one line: Harbor's exception (type and message), else its rewards."""
    exc = result.get("exception_info")
    if isinstance(exc, dict):
        return f"{exc.get('exception_type')}: {exc.get('exception_message')}"
    return result.get("verifier_result")


def test_harbor_runs_oracle_trials_on_its_e2b_environment(stack: Stack, tmp_path: Path) -> None:
    if not HARBOR.exists():
        pytest.skip(f"Harbor is not installed at {HARBOR} (scripts/setup.sh makes .venv-harbor)")
    tag = uuid.uuid4().hex[:8]
    base, image = _images(stack, tmp_path, tag)
    tasks = tmp_path / "tasks"
    _dockerfile_task(tasks, "dockerfile", base)
    _dockerfile_task(tasks, "plain", base)
    _prebuilt_task(tasks, "prebuilt", image)
    _prebuilt_task(tasks, "no-net-agent", image, agent='network_mode = "no-network"\n')
    jobs, name = tmp_path / "jobs", f"aenv-{tag}"

    started = time.monotonic()
    argv = [str(HARBOR), "run", "-p", str(tasks), "-a", "oracle", "-e", "e2b", "-n", "4", "-y"]
    run = subprocess.run(
        [*argv, "-o", str(jobs), "--job-name", name],
        env=_harbor_env(stack),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    took = time.monotonic() - started
    results = [json.loads(p.read_text()) for p in sorted((jobs / name).glob("*/result.json"))]
    print(f"harbor run: {took:.0f}s, exit {run.returncode}\n{_report(results)}")
    out = f"--- stdout\n{run.stdout[-3000:]}\n--- stderr\n{run.stderr[-3000:]}"
    assert run.returncode == 0, out
    assert sorted(r["task_name"] for r in results) == [
        "dockerfile",
        "no-net-agent",
        "plain",
        "prebuilt",
    ], out
    failed = {
        r["task_name"]: _why(r)
        for r in results
        if (r.get("verifier_result") or {}).get("rewards") != {"reward": 1}
    }
    assert failed == {}, f"{_report(results)}\n{json.dumps(failed, indent=1)}\n{out}"
