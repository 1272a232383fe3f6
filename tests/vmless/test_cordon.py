"""Cordon and drain on the real stack, nodes in memory (issue 30): a cordoned node takes no
create — its heartbeat says so before the cordon is answered — and keeps its cordon across
its own restart (it is in the log); `aenv ls --node` lists a node's sandboxes; a drain
pauses every sandbox of its node and counts none durable here (this tier has no snapshot
repository); a fleet all cordoned refuses a create with a 503 that says so; only an
operator's key may cordon. `tests/e2e/test_drain.py` drains real VMs to S3."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import eventually_sync
from tests.vmless.conftest import VmlessStack, vmless_stack
from tests.vmless.keys import minted_key
from tests.vmless.nodes import beats, more_nodes

FIRST, SECOND = "vmless", "vm-two"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VmlessStack]:
    with vmless_stack(tmp_path_factory.mktemp("aenv-cordon")) as s:
        yield s


def _node_of(c: httpx.Client, sandbox_id: str) -> str:
    r = c.get(f"/sandboxes/{sandbox_id}")
    assert r.status_code == 200, r.text
    return str(r.json()["nodeID"])


def _create(c: httpx.Client) -> str:
    r = c.post("/v2/sandboxes", json={"templateID": "base", "timeout": 300})
    assert r.status_code == 201, r.text
    return str(r.json()["sandboxID"])


def _tenant_key(stack: VmlessStack) -> str:
    return minted_key(stack, "tenant", "not an operator")[1]


def test_a_cordoned_node_takes_no_create_even_after_its_restart(
    stack: VmlessStack, tmp_path: Path
) -> None:
    with stack.client(timeout=60) as c:
        with more_nodes(stack, tmp_path / "a", {SECOND: {}}):
            eventually_sync(lambda: SECOND in beats(stack), timeout=30)
            cordon = stack.aenv("node", "cordon", SECOND)
            assert cordon.returncode == 0 and cordon.stdout == f"node {SECOND} cordoned\n", cordon
            assert beats(stack)[SECOND].cordoned  # heard before the command returned
            ids = [_create(c) for _ in range(4)]
            assert {_node_of(c, s) for s in ids} == {FIRST}
        with more_nodes(stack, tmp_path / "b", {SECOND: {}}):  # restarted: still cordoned
            eventually_sync(lambda: beats(stack)[SECOND].cordoned, timeout=30)
            more = [_create(c) for _ in range(4)]
            assert {_node_of(c, s) for s in more} == {FIRST}
            listed = stack.aenv("ls", "--node", FIRST, "-o", "json")
            assert listed.returncode == 0, listed.stderr
            assert {r["sandbox_id"] for r in json.loads(listed.stdout)} >= {*ids, *more}
            r = c.get("/v2/sandboxes", params={"node": SECOND})
            assert r.status_code == 200 and r.json() == []

            # both cordoned: a create is refused at once, saying why
            assert c.post(f"/nodes/{FIRST}/cordon").json()["cordoned"] is True
            refused = c.post("/v2/sandboxes", json={"templateID": "base"})
            assert refused.status_code == 503, refused.text
            assert "every running node is cordoned" in refused.json()["message"]
            assert c.post(f"/nodes/{SECOND}/uncordon").json()["cordoned"] is False
            assert _node_of(c, _create(c)) == SECOND

            # a drain pauses all of the first node's sandboxes; none durable in this tier
            def paused() -> dict[str, object] | None:
                p = c.post(f"/nodes/{FIRST}/drain").json()
                return p if p["running"] == 0 else None

            p = eventually_sync(paused, timeout=60, interval=0.5)
            assert p is not None and p["sandboxes"] == len(ids) + len(more), p
            assert (p["durable"], p["uploading"], p["done"]) == (0, len(ids) + len(more), False)
            for sid in ids:
                assert c.get(f"/sandboxes/{sid}").json()["state"] == "paused"
            assert c.post(f"/nodes/{FIRST}/uncordon").status_code == 200


def test_only_an_operator_may_cordon(stack: VmlessStack) -> None:
    key = _tenant_key(stack)
    with httpx.Client(base_url=stack.api_url, headers={"X-API-KEY": key}, timeout=30) as c:
        for verb in ("cordon", "uncordon", "drain"):
            r = c.post(f"/nodes/{FIRST}/{verb}")
            assert r.status_code == 403, r.text
            assert "operator" in r.json()["message"]
    assert not beats(stack)[FIRST].cordoned
