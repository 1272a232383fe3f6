"""Code-interpreter benchmark: `e2b_code_interpreter.Sandbox.create()` → the first
`run_code("1+1")` answered, beside a plain `e2b.Sandbox.create()` → its first command, in
the same run on the same `aenv up --code-interpreter` stack (interleaved, so drift lands on
both sides). The template is captured with its kernel started, so the difference is the
restore of a bigger guest plus one execution — no kernel start.

Run as root: `python -m bench.codeint_bench [--n 10]`. The first run builds the image
(minutes, cached by digest); the stack's start captures the template.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aenv.stack.process import free_port
from bench.stats import emit, shift, summary


def run(n: int, data: Path) -> dict[str, Any]:
    port = free_port()
    env = {
        **os.environ,
        "AENV_SLOT_PREFIX": "aenvci",
        "AENV_NODE_ID": "cibench",
        "AENV_TLS_PORT": str(free_port()),
    }
    t0 = time.monotonic()
    up = subprocess.run(
        [
            sys.executable,
            "-m",
            "aenv.cli",
            "up",
            "--data-dir",
            str(data),
            "--port",
            str(port),
            "--code-interpreter",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,
    )
    if up.returncode != 0:
        raise SystemExit(f"aenv up failed: {up.stderr[-2000:]}")
    stack_up = time.monotonic() - t0
    info = json.loads((data / "stack.json").read_text())
    os.environ.update({k: info[k] for k in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY")})
    from e2b import Sandbox as Plain
    from e2b_code_interpreter import Sandbox

    s: dict[str, list[float]] = {
        k: []
        for k in (
            "ci_create",
            "ci_first_run_code",
            "ci_create_to_first_result",
            "ci_second_run_code",
            "plain_create",
            "plain_first_command",
            "plain_create_to_first_output",
        )
    }
    try:
        for _ in range(n):
            t = time.monotonic()
            sbx = Sandbox.create(timeout=120)
            t1 = time.monotonic()
            r = sbx.run_code("1+1")
            t2 = time.monotonic()
            assert r.text == "2", r
            sbx.run_code("1+1")
            t3 = time.monotonic()
            sbx.kill()
            s["ci_create"].append(t1 - t)
            s["ci_first_run_code"].append(t2 - t1)
            s["ci_create_to_first_result"].append(t2 - t)
            s["ci_second_run_code"].append(t3 - t2)

            t = time.monotonic()
            plain = Plain.create(timeout=120)
            t1 = time.monotonic()
            out = plain.commands.run("echo 2")
            t2 = time.monotonic()
            assert out.stdout == "2\n"
            plain.kill()
            s["plain_create"].append(t1 - t)
            s["plain_first_command"].append(t2 - t1)
            s["plain_create_to_first_output"].append(t2 - t)
    finally:
        subprocess.run(
            [sys.executable, "-m", "aenv.cli", "down", "--data-dir", str(data)],
            capture_output=True,
            env=env,
            timeout=300,
        )
    return {"samples": s, "stack_up_s": round(stack_up, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--n", type=int, default=10)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="aenv-cibench-", dir="/var/tmp"))
    try:
        r = run(args.n, tmp / "stack")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    s = r["samples"]
    emit(
        "codeint",
        {
            "stack_up_with_template_capture_s": r["stack_up_s"],
            "code_interpreter_create_to_first_run_code_result": summary(
                s["ci_create_to_first_result"]
            ),
            "code_interpreter_create": summary(s["ci_create"]),
            "code_interpreter_first_run_code": summary(s["ci_first_run_code"]),
            "code_interpreter_second_run_code": summary(s["ci_second_run_code"]),
            "plain_create_to_first_command_output": summary(s["plain_create_to_first_output"]),
            "plain_create": summary(s["plain_create"]),
            "plain_first_command": summary(s["plain_first_command"]),
            "extra_ms_hodges_lehmann": shift(
                s["ci_create_to_first_result"], s["plain_create_to_first_output"]
            ),
        },
    )


if __name__ == "__main__":
    main()
