"""Issue 18's "Different from E2B" items through the JavaScript SDK too (npm `e2b`, unchanged;
`js/parity.js`): `startedAfter` inclusive, a rewritten file's metadata cleared, a snapshot
usable at once, a fork child's timeout its parent's, `setTimeout(0)` acting at once, a
`pause({keepMemory: false})` booting again, and `h.wait()` of a killed sandbox raising the
SDK's TimeoutError ("killed"), not "protocol error: missing EndStreamResponse"."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.e2e.conftest import Stack

pytestmark = pytest.mark.vm

NPM = Path(__file__).resolve().parents[2] / ".npm-e2b"
SCRIPT = Path(__file__).with_name("js") / "parity.js"


def test_the_javascript_sdk_sees_e2bs_behaviour(stack: Stack) -> None:
    if not (NPM / "node_modules" / "e2b").exists():
        pytest.skip("npm `e2b` is not installed (scripts/setup.sh installs it with npm)")
    env = {**os.environ, **stack.env(), "NODE_PATH": str(NPM / "node_modules")}
    r = subprocess.run(
        ["node", str(SCRIPT), uuid.uuid4().hex[:8]],
        env=env,
        cwd=NPM,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["listed"] == [out["id"]]
    assert out["metaFirst"] == {"k": "v"} and out["metaAfter"] == {}
    assert out["fromSnapshot"] == "b"
    assert 590 <= out["childLifeS"] <= 610, out
    assert out["afterZero"] == "paused"
    assert out["bootChanged"] and out["keptFile"] == "b"
    assert out["wait"].get("timeout") and "killed" in out["wait"]["message"], out["wait"]
    assert "EndStream" not in out["wait"]["message"]
