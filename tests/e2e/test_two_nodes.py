"""A second node joins the stack (its own process, state dir, slots and node id, the same
NATS and S3): creates are placed on whichever node pulls them, and sandboxes on either
node are driven through the one API — its proxy reaches them through each node's proxy
(the e2e stack runs with AENV_PROXY_VIA_NODE=1, as an API on another host would)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox

from tests.e2e.conftest import Stack

pytestmark = pytest.mark.vm


def _node_env(stack: Stack, data: Path) -> dict[str, str]:
    """The first node's service settings (from its environment), this node's identity."""
    first = json.loads((stack.data_dir / "stack.json").read_text())["roles"]["node"]
    env = dict(
        kv.split("=", 1) for kv in Path(f"/proc/{first}/environ").read_text().split("\0") if kv
    )
    env.update({"AENV_NODE_ID": "e2e-two", "AENV_SLOT_PREFIX": "aenvf",
                "AENV_DATA_DIR": str(data), "AENV_SLOT_POOL": "2"})  # fmt: skip
    env.pop("AENV_TRACE_FILE", None)
    return env


@pytest.fixture
def second_node(stack: Stack, tmp_path: Path) -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "aenv.serve", "node"], env=_node_env(stack, tmp_path / "n2"),
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip() == "ROLE-READY":
                break
        else:
            pytest.fail(f"second node exited during start-up ({proc.wait()})")
        yield "e2e-two"
    finally:
        proc.terminate()
        proc.wait(60)
    from workers.node.net import list_leftovers

    assert list_leftovers("aenvf") == [], "the second node left namespaces behind"


def _node_of(stack: Stack, sandbox_id: str) -> str:
    r = httpx.get(f"{stack.api_url}/sandboxes/{sandbox_id}",
                  headers={"X-API-KEY": stack.api_key})  # fmt: skip
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
