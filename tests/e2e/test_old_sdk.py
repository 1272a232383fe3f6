"""Smoke test with an SDK from before the v2 routes (e2b 2.45.1, its own venv from
scripts/setup.sh): it creates with `POST /sandboxes` and connects with the v1 route."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import Stack

pytestmark = pytest.mark.vm

OLD_PYTHON = Path(os.environ.get("OLD_SDK_VENV", ".venv-e2b-2.45")) / "bin" / "python"

SCRIPT = """
import importlib.metadata as m
from e2b import Sandbox
assert m.version("e2b") == "2.45.1", m.version("e2b")
sbx = Sandbox.create(timeout=120)
print(sbx.commands.run("echo old-sdk-ok").stdout.strip())
sbx.files.write("/home/user/x.txt", "v1")
print(sbx.files.read("/home/user/x.txt"))
again = Sandbox.connect(sbx.sandbox_id)
print(again.commands.run("echo connected").stdout.strip())
print(sbx.kill())
"""


def _metrics(stack: Stack) -> str:
    r = httpx.get(f"{stack.api_url}/metrics", headers={"X-API-KEY": stack.api_key})
    assert r.status_code == 200, r.text
    return r.text


def _posts(metrics: str, route: str) -> int:
    total = 0
    for line in metrics.splitlines():
        if (
            line.startswith("aenv_api_requests_total{")
            and f'route="{route}"' in line
            and ('method="POST"' in line)
        ):
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def test_sdk_2_45_uses_the_v1_routes(stack: Stack) -> None:
    assert OLD_PYTHON.exists(), f"{OLD_PYTHON} missing: run scripts/setup.sh"
    before = _metrics(stack)
    out = subprocess.run(
        [str(OLD_PYTHON), "-c", SCRIPT],
        env={**os.environ, **stack.env()},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["old-sdk-ok", "v1", "connected", "True"]
    after = _metrics(stack)
    assert _posts(after, "/sandboxes") == _posts(before, "/sandboxes") + 1
    connect = "/sandboxes/{sandbox_id}/connect"
    assert _posts(after, connect) > _posts(before, connect)
