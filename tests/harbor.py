"""Harbor (PyPI `harbor`, the agent-benchmark and RL-rollout harness) against an aenv stack:
the tasks, task images and environment that tests/e2e/test_harbor.py and
bench/harbor_bench.py both run Harbor's oracle agent over, so the benchmark times exactly
the work the test proves correct.

Each task's verifier is a plain bash `tests/test.sh` writing `/logs/verifier/reward.txt`;
the images are Debian-shaped (bash, coreutils and their libraries from this host), pushed
to a registry on loopback, so nothing is fetched from the internet. Harbor lives in a venv
of its own (`.venv-harbor`, made by `scripts/setup.sh`: it needs Python 3.12 and pins its
own `e2b`) and runs as a subprocess with its telemetry off and every stray request sent to
a closed loopback port.
"""

from __future__ import annotations

import os
import shutil
from datetime import datetime
from pathlib import Path

from tests.registry import LocalRegistry, debian_tree, layout, push

__all__ = [
    "CLOSED",
    "HARBOR",
    "MIN_FREE_BYTES",
    "PHASES",
    "PROGRAMS",
    "TASKS",
    "dockerfile_task",
    "failure",
    "harbor_env",
    "phase_seconds",
    "prebuilt_task",
    "report",
    "task",
    "task_images",
    "write_tasks",
]

HARBOR = Path(__file__).resolve().parents[1] / ".venv-harbor" / "bin" / "harbor"
#: what Harbor's scripts and aenv's build steps call in the guest
PROGRAMS = ("bash", "cat", "mkdir", "chmod", "rm", "ls", "id", "env", "cp", "touch", "tar")
#: a closed port: any request that ignored NO_PROXY fails here, on the machine
CLOSED = "http://127.0.0.1:9"
#: a trial's phases, as Harbor's result.json times them
PHASES = ("environment_setup", "agent_setup", "agent_execution", "verifier")
#: the tasks `write_tasks` makes, by name
TASKS = ("dockerfile", "no-net-agent", "plain", "prebuilt")
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


def task(root: Path, name: str, toml: str, solve: str, answer: str, expected: str) -> Path:
    """A Harbor task directory: task.toml (with `toml` appended), an instruction, an oracle
    solution running `solve`, and a verifier rewarding 1 when `answer` holds `expected`."""
    path = root / name
    (path / "solution").mkdir(parents=True)
    (path / "tests").mkdir()
    (path / "task.toml").write_text(
        'schema_version = "1.4"\n\n[verifier]\ntimeout_sec = 300.0\n\n'
        f"[agent]\ntimeout_sec = 300.0\n{toml}"
    )
    (path / "instruction.md").write_text(f"Write {answer}.\n")
    (path / "solution/solve.sh").write_text(f"#!/bin/bash\nset -euo pipefail\n{solve}")
    (path / "tests/test.sh").write_text(REWARD_IF.format(answer=answer, expected=expected))
    return path


def dockerfile_task(root: Path, name: str, base: str) -> None:
    """`environment/Dockerfile` FROM `base` with ENV, WORKDIR, COPY and RUN and no USER
    (Harbor builds it through `Template.from_dockerfile`)."""
    path = task(
        root,
        name,
        "\n[environment]\n",
        "cat /app/data.txt /app/built.txt > answer.txt\n"
        'echo "$TASK_GREETING $(pwd)" >> answer.txt\n',
        "/app/answer.txt",
        f"copied into {name}\nbuilt by RUN\nhello /app",
    )
    env = path / "environment"
    env.mkdir()
    (env / "data.txt").write_text(f"copied into {name}\n")
    (env / "Dockerfile").write_text(
        f"FROM {base}\n"
        "ENV TASK_GREETING=hello\n"
        "WORKDIR /app\n"
        "COPY data.txt /app/data.txt\n"
        "RUN echo 'built by RUN' > /app/built.txt && chmod 644 /app/built.txt\n"
    )


def prebuilt_task(root: Path, name: str, image: str, agent: str = "") -> None:
    """`[environment] docker_image` (`Template.from_image`), its ENV and WORKDIR the
    sandbox's defaults; `agent` adds lines to the `[agent]` table."""
    task(
        root,
        name,
        f'{agent}\n[environment]\ndocker_image = "{image}"\n',
        'echo "$PUZZLE_SEED $(cat /opt/puzzle/input.txt) $(pwd)" > /opt/puzzle/answer.txt\n',
        "/opt/puzzle/answer.txt",
        "41 forty-two /srv",
    )


def write_tasks(root: Path, base: str, image: str) -> None:
    """The four tasks (`TASKS`) under `root`: two Dockerfiles FROM `base`, `image` as a
    prebuilt `docker_image`, and on it an `[agent] network_mode = "no-network"` override
    (Harbor turns the sandbox's internet off before the agent, back on for the verifier)."""
    dockerfile_task(root, "dockerfile", base)
    dockerfile_task(root, "plain", base)
    prebuilt_task(root, "prebuilt", image)
    prebuilt_task(root, "no-net-agent", image, agent='network_mode = "no-network"\n')


def task_images(registry: LocalRegistry, work: Path, tag: str) -> tuple[str, str]:
    """A Debian-shaped base (no USER) for the Dockerfiles, and a prebuilt task image on it
    with ENV, WORKDIR and a file of its own; both pushed to `registry`. What they are made
    from under `work` is deleted once pushed."""
    base = debian_tree(work / "tree", *PROGRAMS)
    extra = work / "extra"
    (extra / "opt/puzzle").mkdir(parents=True)
    (extra / "opt/puzzle/input.txt").write_text("forty-two\n")
    (extra / "srv").mkdir()
    config: dict[str, object] = {"config": {"Env": ["PUZZLE_SEED=41"], "WorkingDir": "/srv"}}
    base_ref = push(layout(work / "base-img", base), registry, "tests/harbor-base", tag)
    task_ref = push(
        layout(work / "task-img", base, extra, config=config),
        registry,
        "tests/harbor-task",
        tag,
    )
    for made in ("tree", "extra", "base-img", "task-img"):
        shutil.rmtree(work / made)
    return base_ref, task_ref


def harbor_env(stack_env: dict[str, str]) -> dict[str, str]:
    """This process's environment for Harbor's: the stack's E2B settings, telemetry off,
    every proxy a closed loopback port (only loopback is exempt), none of our venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(stack_env)
    env.update(HARBOR_TELEMETRY="0", LITELLM_LOCAL_MODEL_COST_MAP="True")
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[var] = env[var.lower()] = CLOSED
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    return env


def phase_seconds(phase: dict[str, str] | None) -> float | None:
    """A phase's duration from its result.json timing (None if it never finished)."""
    if not phase or not phase.get("started_at") or not phase.get("finished_at"):
        return None
    start, end = (datetime.fromisoformat(phase[k]) for k in ("started_at", "finished_at"))
    return (end - start).total_seconds()


def report(results: list[dict[str, object]]) -> str:
    """A table: one trial a line, each phase's time and the rewards."""
    lines = [f"{'task':<14}" + "".join(f"{p:>19}" for p in PHASES) + "  rewards"]
    for r in sorted(results, key=lambda r: str(r["task_name"])):
        times = [phase_seconds(r.get(p)) for p in PHASES]  # type: ignore[arg-type]
        verdict = r.get("verifier_result")
        rewards = verdict.get("rewards") if isinstance(verdict, dict) else None
        lines.append(
            f"{r['task_name']!s:<14}"
            + "".join(f"{'-' if t is None else f'{t:.1f}s':>19}" for t in times)
            + f"  {rewards}"
        )
    return "\n".join(lines)


def failure(result: dict[str, object]) -> object:
    """A failed trial in one line: Harbor's exception (type and message), else its rewards."""
    exc = result.get("exception_info")
    if isinstance(exc, dict):
        return f"{exc.get('exception_type')}: {exc.get('exception_message')}"
    return result.get("verifier_result")
