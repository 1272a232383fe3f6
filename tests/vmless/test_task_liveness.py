"""A node's own tasks cannot die silently (`bus.supervised`), checked by injecting the
fault into a live stack: a failpoint (`bus.failpoints`) makes the heartbeat task raise
inside a running node process.

- Restarted in place: the heartbeat raises twice; it beats again within the backoff, the
  node process is the same, `aenv_task_restarts_total{task="heartbeat"}` says 2, and the
  sandbox the node holds stays running — across a window longer than the timer's
  heartbeat-loss threshold (`AENV_NODE_LOST_AFTER_S`, 3 s here) plus its reap period. With
  the task left dead (as before supervision) the timer killed that sandbox as lost.
- Given up: in another node role, run alone (`n3`, meanwhile), a heartbeat that raises
  every time takes the role down with a non-zero exit (70) within seconds, for its
  supervisor to restart — never a live process that does not beat.

A node with nothing armed (`n2`) beats throughout: the timer reaps lost nodes only while
some node beats (with none beating it is more likely the timer that is cut off).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from aenv.logformat import marks
from tests.series import node_url, scrape
from tests.support import eventually_sync
from tests.vmless.conftest import METRICS_TOKEN, VmlessStack, vmless_stack
from tests.vmless.nodes import beats, more_nodes

#: the timer takes a node silent this long for lost (default 60 s): short, so the window
#: the test watches (`WATCH_S`) outlasts it, and the timer's 5 s reap period, by far
LOST_AFTER_S = 3.0
WATCH_S = LOST_AFTER_S + 5.0 + 2.0
#: what the role exits with when a task keeps dying (`aenv.serve.TASK_DIED`)
TASK_DIED = 70


def test_a_heartbeat_killed_in_a_live_node_is_restarted_and_no_sandbox_is_lost(
    tmp_path: Path,
) -> None:
    armed = tmp_path / "failpoints"
    broken = tmp_path / "broken-failpoints"  # n3's: armed for good
    with (
        vmless_stack(
            tmp_path / "stack",
            AENV_FAILPOINTS_FILE=str(armed),
            AENV_NODE_LOST_AFTER_S=str(LOST_AFTER_S),
        ) as stack,
        stack.client() as c,
    ):
        # the stack's node (`vmless`) is the only one yet: the sandbox lands there
        r = c.post("/sandboxes", json={"templateID": "base", "timeout": 300})
        assert r.status_code == 201, r.text
        sid = r.json()["sandboxID"]
        assert c.get(f"/sandboxes/{sid}").json()["state"] == "running"
        node_pid = _node_pid(stack)
        n3, n3_log = _spawn_node(stack, tmp_path / "n3", broken)
        try:
            # n2 beats throughout, with nothing armed
            spare = {"AENV_FAILPOINTS_FILE": str(tmp_path / "none")}
            with more_nodes(stack, tmp_path / "nodes", {"n2": spare}):
                _wait_ready(n3, n3_log)
                eventually_sync(lambda: {"n2", "n3"} <= set(beats(stack)), timeout=10)
                armed.write_text("heartbeat.beat=2\n")
                broken.write_text("heartbeat.beat\n")
                armed_at = time.time()
                states = _watch(c, sid, WATCH_S)
                fleet = beats(stack)
                assert set(states) == {"running"}, states  # none killed as lost
                # given up: a heartbeat dying every time takes its role down, non-zero
                assert n3.wait(timeout=30) == TASK_DIED
        finally:
            if n3.poll() is None:
                n3.send_signal(signal.SIGTERM)
                n3.wait(30)
        assert "task heartbeat keeps dying" in n3_log.read_text(errors="replace")
        # restarted in place: beating since, the same process
        assert fleet["vmless"].at > armed_at + 1.0
        assert _node_pid(stack) == node_pid
        samples = scrape(node_url(stack.bus_settings, "vmless"), METRICS_TOKEN)
        restarts = samples[("aenv_task_restarts_total", frozenset({("task", "heartbeat")}))]
        assert restarts == 2
        log = (stack.data_dir / "aenv.log").read_text(errors="replace")
        assert "task heartbeat died" in log and "failpoint heartbeat.beat" in log
        assert c.get(f"/sandboxes/{sid}").json()["state"] == "running"


def _watch(c: httpx.Client, sid: str, seconds: float) -> list[str]:
    """The sandbox's state as the API shows it, every 0.25 s for `seconds`."""
    states = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        r = c.get(f"/sandboxes/{sid}")
        states.append(r.json().get("state", str(r.status_code)) if r.status_code == 200 else "gone")
        time.sleep(0.25)
    return states


def _node_pid(stack: VmlessStack) -> int:
    info = json.loads((stack.data_dir / "stack.json").read_text())
    pid: int = info["roles"]["node"]
    return pid


def _spawn_node(
    stack: VmlessStack, data: Path, failpoints: Path
) -> tuple[subprocess.Popen[bytes], Path]:
    """A node role alone (no supervisor: its exit status is the test's to read), `n3`,
    with its own failpoints file; and its log."""
    data.mkdir(parents=True)
    log = data / "role.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "aenv.serve", "node"],
            env={
                **stack.env,
                "AENV_NODE_ID": "n3",
                "AENV_DATA_DIR": str(data),
                "AENV_FAILPOINTS_FILE": str(failpoints),
            },
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return proc, log


def _wait_ready(proc: subprocess.Popen[bytes], log: Path) -> None:
    def ready() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"node n3 exited ({proc.returncode}): {log.read_text()[-3000:]}")
        return any(marks(ln, "ROLE-READY") for ln in log.read_text(errors="replace").splitlines())

    eventually_sync(ready, timeout=60, interval=0.2)
