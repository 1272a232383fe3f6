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


WARM = """
import asyncio, json, sys
from envd.app import App
from envd.state import State

async def main(marker):
    state = State(default_user_name="root")
    app = App(state, asyncio.get_running_loop())
    argv = ("/bin/sh", "-c", f"sleep 0.2; echo warmed > {marker}")
    state.preload.start(then=lambda: app.process.warm(argv))
    await state.preload.wait()
    left = len(app.table.procs) + len(app.table.ended)
    print(json.dumps({"seen": open(marker).read().strip(), "left": left}))

asyncio.run(main(sys.argv[1]))
"""


def test_the_preload_runs_a_first_command_and_init_waits_for_its_end(tmp_path: Path) -> None:
    """What a sandbox's first command starts is run once through the process table before
    `/init` may answer (the template is captured after it): its files are then in the
    captured guest's page cache."""
    marker = tmp_path / "warmed"
    out = subprocess.run(
        [sys.executable, "-c", WARM, str(marker)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout) == {"seen": "warmed", "left": 0}


def test_a_warm_up_that_fails_does_not_keep_init_waiting() -> None:
    import asyncio

    from envd.preload import Preload

    async def broken() -> None:
        raise FileNotFoundError("/bin/bash")

    async def main() -> None:
        p = Preload()
        p.start(then=broken)
        await asyncio.wait_for(p.wait(), 5.0)

    asyncio.run(main())
