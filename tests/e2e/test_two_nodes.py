"""A second node joins the stack (its own process, state dir, slots and node id, the same
NATS and S3): creates are placed on whichever node pulls them, and sandboxes on either
node are driven through the one API — its proxy reaches them through each node's proxy
(the e2e stack runs with AENV_PROXY_VIA_NODE=1, as an API on another host would)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import Sandbox

from aenv.logformat import marks
from tests.e2e.conftest import Stack
from tests.support import tagged

pytestmark = pytest.mark.vm


def _node_env(stack: Stack, data: Path) -> dict[str, str]:
    """The first node's service settings (from its environment), this node's identity."""
    first = json.loads((stack.data_dir / "stack.json").read_text())["roles"]["node"]
    env = dict(
        kv.split("=", 1) for kv in Path(f"/proc/{first}/environ").read_text().split("\0") if kv
    )
    env.update(
        {
            "AENV_NODE_ID": "e2e-two",
            "AENV_SLOT_PREFIX": tagged("aenvf"),
            "AENV_DATA_DIR": str(data),
            "AENV_SLOT_POOL": "2",
            # no `code-interpreter-v1` here (no test creates one on this node): its capture
            # is ~40 s of TCG (its server and kernel started) at this node's first start
            "AENV_CODE_INTERPRETER": "0",
        }
    )
    env.pop("AENV_TRACE_FILE", None)
    return env


def _start_node(stack: Stack, data: Path, **extra: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "aenv.serve", "node"],
        env={**_node_env(stack, data), **extra},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if marks(line, "ROLE-READY"):
            _wait_warm(stack, "e2e-two")
            return proc
    pytest.fail(f"second node exited during start-up ({proc.wait()})")


#: a TEST-NET-3 address no test dials: its deny rule marks one sandbox's firewall
MARKER = "203.0.113.77/32"


def _wait_warm(stack: Stack, node_id: str) -> None:
    """Until the node's heartbeat says it holds a warm VM of `base`: before, the API names
    only the first node in a create's `warm_on`, and the new node, which would restore
    cold, passes every create on to it — placement these tests leave to chance must see
    both nodes alike."""
    import asyncio

    from aenv.ops.fleet import read_beats
    from tests.support import eventually_sync

    def warm() -> bool:
        beats = asyncio.run(read_beats(stack.nats_url))
        return any(b.node_id == node_id and b.warm.get("base", 0) > 0 for b in beats)

    eventually_sync(warm, timeout=180, interval=0.5)


def _stop_node(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    proc.wait(60)
    from workers.node.net import list_leftovers

    assert list_leftovers(tagged("aenvf")) == [], "the second node left namespaces behind"


@pytest.fixture
def second_node(stack: Stack, n2: Path) -> Iterator[str]:
    proc = _start_node(stack, n2)
    try:
        yield "e2e-two"
    finally:
        _stop_node(proc)


def _node_of(stack: Stack, sandbox_id: str) -> str:
    r = httpx.get(f"{stack.api_url}/sandboxes/{sandbox_id}", headers={"X-API-KEY": stack.api_key})
    r.raise_for_status()
    return str(r.json()["nodeID"])


def test_creates_spread_over_two_nodes_and_each_is_reachable(
    stack: Stack, second_node: str
) -> None:
    sandboxes: list[Sandbox] = []
    try:
        nodes: set[str] = set()
        for _ in range(12):  # placement is whoever pulls first: both get some, soon
            sbx = Sandbox.create(timeout=300)
            sandboxes.append(sbx)
            nodes.add(_node_of(stack, sbx.sandbox_id))
            if len(nodes) == 2:
                break
        assert second_node in nodes and len(nodes) == 2, nodes
        for sbx in sandboxes:  # every one answers through API -> its node's proxy -> guest
            node = _node_of(stack, sbx.sandbox_id)
            out = sbx.commands.run(f"echo {node}").stdout
            assert out == f"{node}\n"
        on_two = next(s for s in sandboxes if _node_of(stack, s.sandbox_id) == second_node)
        on_two.pause()  # lifecycle commands go to the node that holds it
        back = Sandbox.connect(on_two.sandbox_id, timeout=300)
        assert _node_of(stack, back.sandbox_id) == second_node
        assert back.commands.run("echo resumed").stdout == "resumed\n"
    finally:
        for sbx in sandboxes:
            sbx.kill()


def _on_second_node(stack: Stack, sandboxes: list[Sandbox], **create: Any) -> Sandbox:
    for _ in range(12):  # placement is whoever pulls first: the second node gets one, soon
        sbx = Sandbox.create(timeout=600, **create)
        sandboxes.append(sbx)
        if _node_of(stack, sbx.sandbox_id) == "e2e-two":
            return sbx
    pytest.fail("no create was placed on the second node")


class SecondNode:
    """A second node process the test may kill and start again; the sandboxes it created
    through `place()` are killed at the end."""

    def __init__(self, stack: Stack, data: Path, env: dict[str, str]) -> None:
        self.stack, self.data, self.env = stack, data, env
        self.sandboxes: list[Sandbox] = []
        self.proc = _start_node(stack, data, **env)

    def place(self, **create: Any) -> Sandbox:
        return _on_second_node(self.stack, self.sandboxes, **create)

    def die(self) -> None:
        """No goodbye: the node is simply gone (its VMs die with it), and after 2 s (its
        heartbeat is every 0.5 s in these tests) the API counts it gone."""
        self.proc.kill()
        self.proc.wait(30)
        time.sleep(2.0)

    def start(self) -> None:
        self.proc = _start_node(self.stack, self.data, **self.env)


@contextlib.contextmanager
def _second_node(stack: Stack, data: Path, **env: str) -> Iterator[SecondNode]:
    node = SecondNode(stack, data, env)
    try:
        yield node
    finally:
        if node.proc.poll() is not None:  # back, so that the kills of its sandboxes are done
            node.start()
        for s in node.sandboxes:
            Sandbox.kill(s.sandbox_id)
        _stop_node(node.proc)


def test_a_paused_sandbox_resumes_on_another_node_when_its_node_is_gone(
    stack: Stack, n2: Path
) -> None:
    """Nothing is lost with a node: a sandbox paused there (its capture uploaded) resumes on
    the remaining node from S3, processes and files intact, and under the same
    `update_network` rules (they are the sandbox's, not its slot's: its new firewall is
    built from the log's spec; a deny of a TEST-NET-3 address of its own marks it among
    the node's firewalls); when the dead node comes back, its start-up leaves the moved
    sandbox alone (it only drops its stale local copy)."""
    from tests.e2e.test_pause import COUNTER, _count, _uploaded
    from tests.support import eventually_sync

    data = n2
    # gone after 3 missed beats: 1.5 s
    with _second_node(stack, data, AENV_HEARTBEAT_S="0.5") as node:
        sbx = node.place()
        sbx.update_network({"deny_out": [MARKER]})
        assert len(_firewalls_dropping(tagged("aenvf"), MARKER)) == 1  # applied where it runs
        sbx.files.write("/home/user/moved.txt", "survives its node")
        sbx.commands.run(COUNTER)
        eventually_sync(lambda: _count(sbx) > 2, timeout=20)
        assert sbx.pause()
        eventually_sync(lambda: _uploaded(stack, sbx.sandbox_id), timeout=120, interval=1)
        node.die()
        back = Sandbox.connect(sbx.sandbox_id, timeout=600)
        home = _node_of(stack, sbx.sandbox_id)
        assert home != "e2e-two"
        assert back.files.read("/home/user/moved.txt") == "survives its node"
        assert (back.get_info().network or {}).get("deny_out") == [MARKER]
        assert len(_firewalls_dropping(tagged("aenve"), MARKER)) == 1, "the rules did not move"
        back.update_network({})  # its new node takes updates: the rule goes
        assert _firewalls_dropping(tagged("aenve"), MARKER) == []
        before = _count(back)
        eventually_sync(lambda: _count(back) > before, timeout=20)  # the process runs on
        assert back.pause()  # its new home pauses and resumes it like its own
        back = Sandbox.connect(sbx.sandbox_id, timeout=600)
        assert back.files.read("/home/user/moved.txt") == "survives its node"
        node.start()  # reconciles its journal against the log
        assert back.commands.run("echo still here").stdout == "still here\n"
        assert _node_of(stack, sbx.sandbox_id) == home
        assert not (data / "node" / "snapshots").exists() or not any(
            (data / "node" / "snapshots").glob(f"{sbx.sandbox_id}-p*")
        ), "the returning node kept its stale copy"


def test_a_request_wakes_a_sandbox_whose_node_is_gone_on_another_node(
    stack: Stack, n2: Path
) -> None:
    """Auto-resume through the proxy follows the same resume policy as the resume route:
    the sandbox's node is gone and its capture durable, so the first request that reaches
    it resumes it on a node that runs (before, the proxy sent the resume to the dead
    node's queue and the request waited for a minute, then got a 502)."""
    from tests.e2e.test_pause import _uploaded
    from tests.support import eventually_sync

    with _second_node(stack, n2, AENV_HEARTBEAT_S="0.5") as node:
        sbx = node.place(lifecycle={"on_timeout": "pause", "auto_resume": True})
        sbx.files.write("/home/user/woken.txt", "woken elsewhere")
        assert sbx.pause()
        eventually_sync(lambda: _uploaded(stack, sbx.sandbox_id), timeout=120, interval=1)
        node.die()
        t0 = time.monotonic()
        assert sbx.files.read("/home/user/woken.txt") == "woken elsewhere"  # via the proxy
        assert time.monotonic() - t0 < 50
        assert _node_of(stack, sbx.sandbox_id) != "e2e-two"
        assert sbx.commands.run("echo awake").stdout == "awake\n"


def test_a_paused_sandbox_whose_node_is_gone_before_its_upload_is_a_clear_503(
    stack: Stack, n2: Path
) -> None:
    # its pauses stay local
    with _second_node(stack, n2, AENV_HEARTBEAT_S="0.5", AENV_S3_ENDPOINT="") as node:
        sbx = node.place()
        assert sbx.pause()
        node.die()
        r = httpx.post(
            f"{stack.api_url}/sandboxes/{sbx.sandbox_id}/connect",
            json={"timeout": 60},
            headers={"X-API-KEY": stack.api_key},
            timeout=30,
        )
        assert r.status_code == 503, r.text
        assert "not running" in r.json()["message"]


def test_commands_for_sandboxes_on_a_gone_node_answer_at_once(stack: Stack, n2: Path) -> None:
    """A command put on a dead node's queue would wait there for the command timeout:
    a pause answers 503 at once, a kill kills in the log; the node, back, drops the
    capture of the sandbox killed while it was away."""
    data = n2
    headers = {"X-API-KEY": stack.api_key}
    with _second_node(stack, data, AENV_HEARTBEAT_S="0.5", AENV_S3_ENDPOINT="") as node:
        running = node.place()
        paused = node.place()
        assert paused.pause()
        assert any((data / "node" / "snapshots").glob(f"{paused.sandbox_id}-p*"))
        node.die()
        with httpx.Client(base_url=stack.api_url, headers=headers, timeout=30) as c:
            t0 = time.monotonic()
            r = c.post(f"/sandboxes/{running.sandbox_id}/pause")
            assert r.status_code == 503 and "not running" in r.json()["message"], r.text
            for sbx in (running, paused):
                assert c.delete(f"/sandboxes/{sbx.sandbox_id}").status_code == 204
                assert c.get(f"/sandboxes/{sbx.sandbox_id}").status_code == 404
            assert time.monotonic() - t0 < 10  # not a command timeout
        node.start()  # reconciles: both are killed in the log
        assert not any((data / "node" / "snapshots").glob(f"{paused.sandbox_id}-p*"))
        for sbx in (running, paused):
            assert not (data / "node" / "journal" / f"{sbx.sandbox_id}.json").exists()


def _template_durable(stack: Stack, name: str) -> str | None:
    """The repository key the log records for a snapshot template's capture."""
    import asyncio

    from bus import Bus, BusSettings

    async def read() -> str | None:
        bus = await Bus.connect(BusSettings(nats_url=stack.nats_url), setup=False)
        try:
            tpl, _ = await bus.templates.load(name)
            return tpl.capture_key if tpl is not None else None
        finally:
            await bus.close()

    return asyncio.run(read())


def test_a_snapshot_whose_node_is_gone_starts_on_another_node(stack: Stack, n2: Path) -> None:
    """A persistent snapshot outlives the node that took it: once its capture is in S3 (the
    log says so), creates from it go to a live node, which pulls it — files and the token
    its guest holds included."""
    from tests.support import eventually_sync

    name = f"moving-{time.time_ns() % 10**8}"
    with _second_node(stack, n2, AENV_HEARTBEAT_S="0.5") as node:
        try:
            src = node.place()
            src.files.write("/home/user/snap.txt", "taken on the second node")
            src.create_snapshot(name=name)
            eventually_sync(lambda: _template_durable(stack, name), timeout=120, interval=1)
            node.die()
            child = Sandbox.create(name, timeout=300)
            node.sandboxes.append(child)
            assert _node_of(stack, child.sandbox_id) != "e2e-two"
            assert child.files.read("/home/user/snap.txt") == "taken on the second node"
            assert child.commands.run("echo pulled").stdout == "pulled\n"
            again = Sandbox.create(name, timeout=300)  # the second one finds it local
            node.sandboxes.append(again)
            assert again.files.read("/home/user/snap.txt") == "taken on the second node"
            record = stack.data_dir / "node" / "snapshot-templates" / f"{name}.json"
            assert record.exists()  # the first node keeps it as its own now
            for s in node.sandboxes:
                Sandbox.kill(s.sandbox_id)
            # the node that took it comes back with its own copy: a delete must reach both
            # (one command id sent to two queues is one message to JetStream)
            theirs = n2 / "node" / "snapshot-templates" / f"{name}.json"
            node.start()
            assert theirs.exists()
            eventually_sync(lambda: _beats(stack, "e2e-two"), timeout=10)
            assert Sandbox.delete_snapshot(name)
            eventually_sync(lambda: not record.exists() and not theirs.exists(), timeout=30)
        finally:
            Sandbox.delete_snapshot(name)


def _beats(stack: Stack, node_id: str) -> bool:
    """Whether the node's heartbeat is in the nodes bucket (the API sends deletes to every
    node it finds there)."""
    import asyncio

    from bus import Bus, BusSettings
    from bus.nodes import NodeBook

    async def read() -> bool:
        bus = await Bus.connect(BusSettings(nats_url=stack.nats_url), setup=False)
        try:
            book = await NodeBook.open(bus.js, bus.names.nodes_bucket)
            return not await book.gone(node_id)
        finally:
            await bus.close()

    return asyncio.run(read())


def _firewalls_dropping(prefix: str, cidr: str) -> list[str]:
    """The slot namespaces of a node (its slot prefix) whose firewall drops `cidr`."""
    from workers.node.net import list_leftovers

    found = []
    for ns in list_leftovers(prefix):
        saved = subprocess.run(
            ["nsenter", f"--net=/run/netns/{ns}", "iptables-save"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        # iptables-save orders a rule's matches its own way: -s, -d, -i, -o, -j
        if any(f"-d {cidr} " in ln and ln.endswith("-j DROP") for ln in saved.stdout.splitlines()):
            found.append(ns)
    return found
