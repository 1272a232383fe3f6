"""A rolling upgrade of a two-node stack of real VMs loses no sandbox (issue 30's done-when):
`AENV_ROLLING_SANDBOXES` sandboxes (4 here; `make test-scale`: 10, the issue's) spread over
both nodes, each with a file and a process holding a random value in its memory; then each
node in turn is drained, restarted and uncordoned, and every sandbox it held resumes — on
the other node while it is cordoned — with its file, the same value and a counter that goes
on; a create works after each step.

The two ways a node is drained are both taken: the stack's own node by `aenv node drain`,
then SIGTERM to its role and the supervisor's restart; the second node by SIGTERM alone, as
its systemd unit or DaemonSet stops it (`AENV_STOP_DRAIN=pause`: it cordons itself, pauses
every sandbox into the repository and exits once each is durable), then started again.
The summary line (`-s`) gives each drain's seconds per sandbox: the measure the deploy
files' stop graces are set from.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox

from aenv.logformat import marks
from tests.e2e.conftest import Stack
from tests.e2e.test_drain import HOLDER, _beat, _counts_past, _held, _ok, _state
from tests.e2e.test_two_nodes import SecondNode, _node_env, _node_of, _second_node
from tests.support import eventually_sync

pytestmark = [pytest.mark.vm, pytest.mark.timeout(3600)]

COUNT = int(os.environ.get("AENV_ROLLING_SANDBOXES", "4"))
FIRST, SECOND = "e2e", "e2e-two"
#: the second node's bound on its SIGTERM drain (the deploy files' is longer: more VMs)
STOP_DRAIN_S = 900
NOTE = "/home/user/note.txt"


@pytest.fixture
def uncordoned(stack: Stack) -> Iterator[None]:
    """Both nodes take creates again after the test, whatever it left (the package's other
    tests share these node ids): appended to the log, not waited for — the second node
    stops at the end by its own drain, which cordons it, and a stopped node cannot say it
    heard (the route would wait for its heartbeat to go stale)."""
    yield
    import asyncio

    from bus import Bus, BusSettings
    from bus.decisions import execute
    from domain import node as nd

    async def uncordon() -> None:
        bus = await Bus.connect(BusSettings(nats_url=stack.nats_url), setup=False)
        try:
            for node in (FIRST, SECOND):
                await execute(bus.node_orders, nd.UncordonNode(node_id=node))
        finally:
            await bus.close()

    asyncio.run(uncordon())


def _spread(stack: Stack, sandboxes: list[Sandbox]) -> dict[str, tuple[str, int]]:
    """COUNT sandboxes, half on each node (the other cordoned meanwhile), each with its
    note and its holder running; what each holds."""
    for node, other, n in ((FIRST, SECOND, (COUNT + 1) // 2), (SECOND, FIRST, COUNT // 2)):
        _ok(stack, "node", "cordon", other)
        for _ in range(n):
            sbx = Sandbox.create(timeout=3600)
            sandboxes.append(sbx)
            assert _node_of(stack, sbx.sandbox_id) == node
            sbx.files.write(NOTE, f"note of {sbx.sandbox_id}")
            sbx.commands.run(HOLDER)
        _ok(stack, "node", "uncordon", other)
    held: dict[str, tuple[str, int]] = {}
    for sbx in sandboxes:
        _counts_past(sbx, 2)
        held[sbx.sandbox_id] = _held(sbx)
    return held


def _resume_all(stack: Stack, held: dict[str, tuple[str, int]], *, on: str) -> int:
    """Resume (or reach) every sandbox: each runs with its note and its value, its counter
    going on. Those that were paused land on `on` (the other node is cordoned). Returns
    how many were paused."""
    resumed = 0
    for sid, (value, count) in held.items():
        was_paused = _state(stack, sid)[0] == "paused"
        back = Sandbox.connect(sid, timeout=3600)
        if was_paused:
            resumed += 1
            assert _node_of(stack, sid) == on, sid
        assert back.files.read(NOTE) == f"note of {sid}"
        now_value, now_count = _held(back)
        assert now_value == value, f"{sid}: the process lost its memory"
        assert now_count >= count, f"{sid}: restored from an older capture"
        _counts_past(back, now_count)
        # what it holds now, later than any capture before: a restore of one of those
        # (a stale local copy) shows a smaller count after the next move
        held[sid] = (value, _held(back)[1])
    return resumed


def _create_works(stack: Stack, made: list[Sandbox]) -> None:
    sbx = Sandbox.create(timeout=600)
    made.append(sbx)
    assert sbx.commands.run("echo ok").stdout == "ok\n"
    sbx.kill()


def _restart_first(stack: Stack) -> None:
    """SIGTERM to the stack's node role; its supervisor starts it again."""
    info = json.loads((stack.data_dir / "stack.json").read_text())
    old = info["roles"]["node"]
    since = time.time()
    os.kill(old, signal.SIGTERM)

    def back() -> bool:
        now = json.loads((stack.data_dir / "stack.json").read_text())
        return (
            now["roles"].get("node") not in (None, old)
            and now["role_status"]["node"]["state"] == "ready"
        )

    eventually_sync(back, timeout=600, interval=1)
    eventually_sync(lambda: _beat(stack, FIRST).at > since, timeout=60, interval=0.5)


class _Lines:
    """What a node process prints, read as it comes (an unread pipe would stop the node once
    full) and kept."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert proc.stdout is not None
        self._thread = threading.Thread(target=self.lines.extend, args=(proc.stdout,))
        self._thread.start()

    def until_closed(self, timeout: float) -> list[str]:
        self._thread.join(timeout)
        return self.lines


def _start_second(node: SecondNode) -> None:
    """The second node started again, cordoned (it keeps no warm VM: `_start_node` would
    wait for one)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "aenv.serve", "node"],
        env={**_node_env(node.stack, node.data), **node.env},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if marks(line, "ROLE-READY"):
            node.proc = proc
            return
    pytest.fail(f"second node exited during start-up ({proc.wait()})")


def _stop_drained(node: SecondNode, out: _Lines) -> tuple[float, list[str]]:
    """SIGTERM to the second node: it drains by pause and exits 0. Its seconds and its
    `stop drain` lines."""
    started = time.monotonic()
    node.proc.terminate()
    rc = node.proc.wait(timeout=STOP_DRAIN_S + 120)
    elapsed = time.monotonic() - started
    lines = [ln for ln in out.until_closed(60) if "stop drain" in ln]
    assert rc == 0, lines
    return elapsed, lines


def test_a_rolling_upgrade_of_both_nodes_loses_no_sandbox(
    stack: Stack,
    n2: Path,
    uncordoned: None,
) -> None:
    sandboxes: list[Sandbox] = []
    env = {
        "AENV_SLOT_POOL": str(COUNT + 2),
        "AENV_STOP_DRAIN": "pause",
        "AENV_STOP_DRAIN_S": str(STOP_DRAIN_S),
    }
    with _second_node(stack, n2, **env) as node:
        out = _Lines(node.proc)
        try:
            held = _spread(stack, sandboxes)
            on_first = [s for s in held if _node_of(stack, s) == FIRST]

            # 1. the stack's node: aenv node drain, SIGTERM (its supervisor restarts it)
            started = time.monotonic()
            drained = _ok(stack, "node", "drain", FIRST, timeout=3000)
            first_s = time.monotonic() - started
            assert drained.endswith(f"node {FIRST} drained\n"), drained
            for sid in on_first:
                assert _state(stack, sid) == ("paused", FIRST)
            _restart_first(stack)
            assert _resume_all(stack, held, on=SECOND) == len(on_first)  # cordoned: elsewhere
            _ok(stack, "node", "uncordon", FIRST)
            _create_works(stack, sandboxes)

            # 2. the second node, now holding every sandbox: SIGTERM drains it by pause
            on_second = [s for s in held if _node_of(stack, s) == SECOND]
            assert len(on_second) == COUNT
            second_s, lines = _stop_drained(node, out)
            last = re.search(r"(\d+) of (\d+) sandboxes paused and durable", lines[-2])
            assert last is not None and last[1] == last[2] and int(last[1]) >= COUNT, lines
            for sid in on_second:
                assert _state(stack, sid) == ("paused", SECOND)  # and durable (_state)
            _start_second(node)  # still cordoned: its own stop drain's cordon
            out = _Lines(node.proc)
            assert _resume_all(stack, held, on=FIRST) == COUNT
            _ok(stack, "node", "uncordon", SECOND)
            _create_works(stack, sandboxes)

            assert len(held) == COUNT  # 0 lost: each ran on with its memory and file
            print(
                f"\nrolling upgrade: {COUNT} sandboxes, 0 lost; "
                f"aenv node drain {FIRST}: {len(on_first)} in {first_s:.0f} s "
                f"({first_s / max(1, len(on_first)):.1f} s each); "
                f"SIGTERM drain {SECOND}: {COUNT} in {second_s:.0f} s "
                f"({second_s / COUNT:.1f} s each)"
            )
        finally:
            if node.proc.poll() is not None:  # back (cordoned: no warm VM to wait for)
                _start_second(node)
                out = _Lines(node.proc)
            node.sandboxes.extend(sandboxes)  # killed before the second node stops
