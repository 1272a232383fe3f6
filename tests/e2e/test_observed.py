"""A sandbox's metrics and logs the way E2B's clients ask for them: `Sandbox.get_metrics()`
in the Python SDK and the JavaScript SDK, `e2b sandbox metrics|logs` of E2B's CLI, and
`aenv metrics|logs` — samples of CPU, memory and disk over the sandbox's life (across a
pause), and the lines its envd logged; E2B's CLI reads the v1 logs route, aenv's the v2 one,
and `GET /sandboxes/metrics` answers each sandbox's latest sample."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox

from tests.e2e.conftest import AENV, Stack
from tests.support import eventually_sync

pytestmark = pytest.mark.vm

NPM = Path(__file__).resolve().parents[2] / ".npm-e2b"
CLI = NPM / "node_modules" / ".bin" / "e2b"


def test_metrics_and_logs_over_a_sandboxs_life(stack: Stack) -> None:
    sbx = Sandbox.create(timeout=300)
    try:
        sbx.commands.run("echo observed-by-the-test")
        first = eventually_sync(lambda: sbx.get_metrics() or None, timeout=30, interval=1)
        assert first is not None
        m = first[-1]
        assert m.cpu_count >= 1 and m.mem_total > m.mem_used > 0 and m.disk_total > 0
        sbx.pause()
        paused = Sandbox.connect(sbx.sandbox_id, timeout=300)  # resumed

        def more() -> list | None:  # type: ignore[type-arg]
            got = paused.get_metrics()
            return got if len(got) > len(first) else None

        samples = eventually_sync(more, timeout=30, interval=1)
        assert samples is not None
        assert [s.timestamp for s in samples] == sorted(s.timestamp for s in samples)
        assert samples[0].timestamp == first[0].timestamp  # the history before the pause
        # E2B's multi-sandbox route: each sandbox's latest sample (no SDK method calls it)
        many = httpx.get(
            f"{stack.api_url}/sandboxes/metrics",
            timeout=30,
            params={"sandbox_ids": f"{sbx.sandbox_id},nosuchsandbox0000000"},
            headers={"X-API-KEY": stack.api_key},
        )
        assert many.status_code == 200, many.text
        latest = many.json()["sandboxes"]
        assert list(latest) == [sbx.sandbox_id] and latest[sbx.sandbox_id]["cpuCount"] >= 1
        env = {**os.environ, **stack.env()}
        cli = subprocess.run(
            [*AENV, "metrics", sbx.sandbox_id, "-o", "json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert cli.returncode == 0, cli.stderr
        assert len(json.loads(cli.stdout)) >= len(samples)
        logs = subprocess.run(
            [*AENV, "logs", sbx.sandbox_id], env=env, capture_output=True, text=True, timeout=60
        )
        assert logs.returncode == 0, logs.stderr
        assert "echo observed-by-the-test" in logs.stdout or "process" in logs.stdout.lower()
        if CLI.exists():  # E2B's own CLI, unchanged
            e2b_env = {**env, "NO_COLOR": "1"}
            for what in ("metrics", "logs"):
                r = subprocess.run(
                    [str(CLI), "sandbox", what, sbx.sandbox_id],
                    env=e2b_env,
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                assert r.returncode == 0, (what, r.stdout, r.stderr)
                assert r.stdout.strip(), what
        if (NPM / "node_modules" / "e2b").exists():  # the JavaScript SDK, unchanged
            script = (
                "const {Sandbox} = require('e2b');"
                "Sandbox.getMetrics(process.argv[1]).then(m => "
                "{console.log(JSON.stringify(m)); process.exit(0)})"
                ".catch(e => {console.error(e); process.exit(1)})"
            )
            r = subprocess.run(
                ["node", "-e", script, sbx.sandbox_id],
                env=env,
                cwd=NPM,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert r.returncode == 0, r.stderr
            got = json.loads(r.stdout)
            assert got and got[0]["cpuCount"] >= 1 and got[0]["memTotal"] > 0
    finally:
        Sandbox.kill(sbx.sandbox_id)
