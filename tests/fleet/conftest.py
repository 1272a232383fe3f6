"""The fleet of `bench.fleetrig` on this machine for the fleet test: a 3-server NATS
JetStream cluster, one Postgres, one SeaweedFS, two API processes and three node processes
(`aenv serve --role api|node`). Size: `AENV_FLEET_N` sandboxes (CI runs the default, a
reduced size; `AENV_FLEET_N=30 pytest tests/fleet -s` for the full run)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.fleetrig import NODES, Fleet, RigError, fleet_rig
from tests.support import session_tag

pytestmark = [pytest.mark.vm, pytest.mark.fleet]

SIZE = int(os.environ.get("AENV_FLEET_N", "12"))

__all__ = ["SIZE", "Fleet"]


@pytest.fixture(scope="package")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    if os.geteuid() != 0:
        pytest.skip("the fleet runs microVMs: needs root")
    root = Path(tmp_path_factory.mktemp("aenv-fleet"))
    # heartbeats every second and a node lost after 15 s: the faults play out in seconds
    env = {"AENV_HEARTBEAT_S": "1", "AENV_NODE_LOST_AFTER_S": "15"}
    try:
        with fleet_rig(root, env=env, tag=session_tag()) as f:
            yield f
    except RigError as e:
        pytest.fail(str(e))
    from workers.node.net import list_leftovers

    left = [ns for _, prefix, _ in NODES for ns in list_leftovers(prefix + session_tag())]
    assert left == [], f"network namespaces left behind: {left}"
    procs = subprocess.run(["pgrep", "-af", str(root)], capture_output=True, text=True)
    assert procs.stdout.strip() == "", f"processes left behind: {procs.stdout}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    f = getattr(item, "funcargs", {}).get("fleet")
    if report.failed and isinstance(f, Fleet):
        for role in [*f.apis, *f.nodes]:
            report.sections.append((f"{role.name} (tail)", role.tail(80)))
