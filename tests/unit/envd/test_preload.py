"""envd's preload: the modules its lazy imports would otherwise load on a restored
sandbox's first request must be in before `/init` answers (the template capture follows)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

PROBE = """
import asyncio, json, sys
from envd.preload import MODULES
from envd.state import State

async def main():
    state = State()
    before = [m for m in MODULES if m in sys.modules]
    state.preload.start()
    await state.preload.wait()
    after = [m for m in MODULES if m in sys.modules]
    print(json.dumps({"before": before, "after": after, "all": list(MODULES)}))

asyncio.run(main())
"""


def test_preload_imports_the_lazy_modules_in_a_fresh_envd_process() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True
    )
    seen = json.loads(out.stdout)
    assert "hmac" not in seen["before"]  # envd itself must not import it at start-up
    assert seen["after"] == seen["all"]


def test_waiting_without_a_preload_returns_at_once() -> None:
    import asyncio

    from envd.preload import Preload

    asyncio.run(asyncio.wait_for(Preload().wait(), 1.0))
