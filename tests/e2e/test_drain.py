"""Cordon and drain (issue 30) on a two-node stack of real VMs: `aenv node drain` pauses
every sandbox of a node into the snapshot repository and exits 0 once each is paused and
durable; each then resumes on the other node — its files there and its process still
running with what it held in memory — while the drained node stays cordoned; a create
while it is cordoned lands on the other node, and once uncordoned it takes creates again.

`AENV_DRAIN_SANDBOXES` sandboxes are drained (3 here; `make test-scale`: 10, the issue's).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox

from bus.nodes import Heartbeat
from tests.e2e.conftest import Stack
from tests.e2e.test_two_nodes import _node_of, _second_node
from tests.support import eventually_sync
from tests.vmstack import AENV

pytestmark = [pytest.mark.vm, pytest.mark.timeout(1800)]

COUNT = int(os.environ.get("AENV_DRAIN_SANDBOXES", "3"))
FIRST, SECOND = "e2e", "e2e-two"
#: A process that holds a random value only in its memory and writes it with a counter
#: every 0.2 s: after the resume, the same value and a counter that goes on mean the
#: process kept running with its memory (a restarted one would draw a new value).
HOLDER = (
    "python3 -c 'import os, secrets, time\n"
    "v, n = secrets.token_hex(8), 0\n"
    "while True:\n"
    "    n += 1\n"
    '    open("/tmp/held.new", "w").write(f"{v} {n}")\n'
    '    os.replace("/tmp/held.new", "/tmp/held")\n'
    "    time.sleep(0.2)\n' >/dev/null 2>&1 &"
)


def _held(sbx: Sandbox) -> tuple[str, int]:
    value, count = sbx.files.read("/tmp/held").split()
    return value, int(count)


def _counts_past(sbx: Sandbox, count: int) -> None:
    """Return once the holder's counter is past `count` (it runs)."""
    eventually_sync(lambda: _held(sbx)[1] > count, timeout=60)


def _aenv(stack: Stack, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **stack.env()}
    return subprocess.run([*AENV, *args], env=env, capture_output=True, text=True, timeout=timeout)


def _ok(stack: Stack, *args: str, timeout: float = 120) -> str:
    done = _aenv(stack, *args, timeout=timeout)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def _state(stack: Stack, sandbox_id: str) -> tuple[str, str | None]:
    """Its status and node in the log (the write side: what a drain decides on)."""
    import asyncio

    from bus import Bus, BusSettings

    async def read() -> tuple[str, str | None]:
        bus = await Bus.connect(BusSettings(nats_url=stack.nats_url), setup=False)
        try:
            state, _ = await bus.sandboxes.load(sandbox_id)
        finally:
            await bus.close()
        assert state is not None
        assert state.status != "paused" or state.resumable_anywhere, f"{sandbox_id} not durable"
        return state.status, state.node_id

    return asyncio.run(read())


def _beat(stack: Stack, node_id: str) -> Heartbeat:
    import asyncio

    from aenv.ops.fleet import read_beats

    return next(b for b in asyncio.run(read_beats(stack.nats_url)) if b.node_id == node_id)


@pytest.fixture
def uncordoned(stack: Stack) -> Iterator[None]:
    """Both nodes take creates again after the test, whatever it left: the cordon is in the
    log, and the package's other tests share these node ids."""
    yield
    for node in (FIRST, SECOND):
        r = httpx.post(
            f"{stack.api_url}/nodes/{node}/uncordon",
            headers={"X-API-KEY": stack.api_key},
            timeout=60,
        )
        assert r.status_code == 200, r.text


def test_a_drained_node_s_sandboxes_resume_on_the_other_with_their_memory(
    stack: Stack, n2: Path, uncordoned: None
) -> None:
    sandboxes: list[Sandbox] = []
    with _second_node(stack, n2, AENV_SLOT_POOL=str(COUNT + 2)) as node:
        try:
            # the second node cordoned: every create lands on the first
            assert _ok(stack, "node", "cordon", SECOND) == f"node {SECOND} cordoned\n"
            held: dict[str, tuple[str, int]] = {}
            for _ in range(COUNT):
                sbx = Sandbox.create(timeout=1800)
                sandboxes.append(sbx)
                assert _node_of(stack, sbx.sandbox_id) == FIRST
                sbx.files.write("/home/user/note.txt", f"note of {sbx.sandbox_id}")
                sbx.commands.run(HOLDER)
            for sbx in sandboxes:
                _counts_past(sbx, 2)
                held[sbx.sandbox_id] = _held(sbx)
            listed = _ok(stack, "ls", "--node", FIRST, "-o", "json")
            ids = {sbx.sandbox_id for sbx in sandboxes}
            assert ids <= {r["sandbox_id"] for r in _json(listed)}
            assert not ids & {
                r["sandbox_id"] for r in _json(_ok(stack, "ls", "--node", SECOND, "-o", "json"))
            }
            _ok(stack, "node", "uncordon", SECOND)

            out = _ok(stack, "node", "drain", FIRST, timeout=1500)
            assert out.endswith(f"node {FIRST} drained\n"), out
            last = out.splitlines()[-2]
            assert "sandboxes paused and durable" in last and " of " in last, out
            for sbx in sandboxes:  # each paused, its capture in the repository
                assert _state(stack, sbx.sandbox_id) == ("paused", FIRST)
            eventually_sync(lambda: not _beat(stack, FIRST).warm, timeout=30)  # warm VMs gone

            # a create while the first node is cordoned lands on the second
            fresh = Sandbox.create(timeout=600)
            sandboxes.append(fresh)
            assert _node_of(stack, fresh.sandbox_id) == SECOND

            for sbx in sandboxes[:COUNT]:  # resumed without an uncordon: on the second node
                back = Sandbox.connect(sbx.sandbox_id, timeout=600)
                assert _node_of(stack, sbx.sandbox_id) == SECOND
                assert back.files.read("/home/user/note.txt") == f"note of {sbx.sandbox_id}"
                value, count = _held(back)
                assert value == held[sbx.sandbox_id][0], "the process lost its memory"
                assert count >= held[sbx.sandbox_id][1]
                _counts_past(back, count)

            # uncordoned, the first node takes creates again (the second cordoned to tell)
            _ok(stack, "node", "uncordon", FIRST)
            _ok(stack, "node", "cordon", SECOND)
            again = Sandbox.create(timeout=600)
            sandboxes.append(again)
            assert _node_of(stack, again.sandbox_id) == FIRST
            _ok(stack, "node", "uncordon", SECOND)
        finally:
            node.sandboxes.extend(sandboxes)  # killed before the second node stops


def _json(out: str) -> list[dict[str, object]]:
    import json

    rows = json.loads(out)
    assert isinstance(rows, list)
    return rows
