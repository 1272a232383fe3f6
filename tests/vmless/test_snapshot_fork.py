"""Fork of a snapshot on the real stack, nodes in memory (issue 32): the children of one
call are sandboxes of the snapshot, each its own, named by the fork in their metadata (one
bulk call lists or ends them); an Idempotency-Key's retry answers the same children; bad
counts, an unknown snapshot, a built template and another team's snapshot are 4xx with
E2B's body; `aenv snapshot fork` is one such call. (The in-memory node has no repository:
the snapshot stays on its node, and so do its children — the spread over two nodes is
`tests/e2e/test_snapshot_fork.py`'s.)"""

from __future__ import annotations

import secrets

import httpx
from e2b import Sandbox

from tests.vmless.conftest import VmlessStack
from tests.vmless.test_leases import tenant_key


def test_a_snapshot_forks_into_children_one_bulk_call_ends(
    vmless: VmlessStack, sdk_env: None
) -> None:
    src = Sandbox.create(timeout=600)
    name = f"fork-{secrets.token_hex(4)}"
    run = secrets.token_hex(3)
    try:
        src.create_snapshot(name=name)
    finally:
        src.kill()  # the snapshot outlives its sandbox
    try:
        with vmless.client(timeout=120) as c:
            r = c.post(
                f"/snapshots/{name}/fork",
                json={"count": 5, "timeout": 300, "metadata": {"run": run}},
            )
            assert r.status_code == 201, r.text
            kids = [x["sandbox"] for x in r.json()]
            assert len(kids) == 5 and len({k["sandboxID"] for k in kids}) == 5
            assert len({k["envdAccessToken"] for k in kids}) == 5
            assert {k["templateID"] for k in kids} == {name}
            info = c.get(f"/sandboxes/{kids[0]['sandboxID']}").json()
            assert info["metadata"]["run"] == run and info["nodeID"] == "vmless"
            fork = info["metadata"]["aenv.fork"]
            listed = c.post("/sandboxes/bulk/list", json={"metadata": {"aenv.fork": fork}})
            listed_ids = sorted(x["sandboxID"] for x in listed.json()["sandboxes"])
            assert listed_ids == sorted(k["sandboxID"] for k in kids), listed.text

            headers = {"Idempotency-Key": f"retry-{run}"}
            first = c.post(f"/snapshots/{name}/fork", json={"count": 2}, headers=headers)
            again = c.post(f"/snapshots/{name}/fork", json={"count": 2}, headers=headers)
            assert first.status_code == again.status_code == 201, again.text
            ids = [x["sandbox"]["sandboxID"] for x in first.json()]
            assert [x["sandbox"]["sandboxID"] for x in again.json()] == ids

            ended = c.post("/sandboxes/bulk/kill", json={"metadata": {"aenv.fork": fork}})
            assert ended.json()["count"] == 5, ended.text
            for sid in ids:
                c.delete(f"/sandboxes/{sid}")
            cli = vmless.aenv("snapshot", "fork", name, "-n", "2", "-m", "via=cli")
            assert cli.returncode == 0, cli.stderr
            by_cli = cli.stdout.split()
            assert len(by_cli) == 2
            for sid in by_cli:
                assert c.get(f"/sandboxes/{sid}").json()["metadata"]["via"] == "cli"
                c.delete(f"/sandboxes/{sid}")
            unknown = vmless.aenv("snapshot", "fork", "no-such-snapshot")
            assert unknown.returncode != 0 and "not found" in unknown.stderr
            _refusals(vmless, c, name)
    finally:
        Sandbox.delete_snapshot(name)


def _refusals(stack: VmlessStack, c: httpx.Client, name: str) -> None:
    for bad in (0, 101):
        r = c.post(f"/snapshots/{name}/fork", json={"count": bad})
        assert r.status_code == 400 and r.json()["code"] == 400, r.text
        assert "Count" in r.json()["message"]
    r = c.post(f"/snapshots/{name}/fork", json={"count": 1, "timeout": 0})
    assert r.status_code == 400, r.text
    for unknown in ("no-such-snapshot", "base"):  # `base` is a template, not a snapshot
        r = c.post(f"/snapshots/{unknown}/fork", json={"count": 1})
        assert r.status_code == 404 and r.json() == {
            "code": 404,
            "message": f"Snapshot '{unknown}' not found",
        }
    theirs = httpx.post(
        f"{stack.api_url}/snapshots/{name}/fork",
        json={"count": 1},
        headers={"X-API-KEY": tenant_key(stack, "fork-tenant")},
        timeout=60,
    )
    assert theirs.status_code == 404, theirs.text
