"""Fork of a persistent snapshot into N rollouts across two nodes (issue 32; E2B infra's
`POST /snapshots/{id}/fork`): a prepared sandbox is snapshotted and killed, its snapshot
forks into `AENV_SNAPSHOT_FORK_CHILDREN` children (6 here, 24 in `make test-scale`), which
land on both nodes — each node fetching the capture once and restoring its share
copy-on-write — and each has the files and the processes of the moment of the snapshot.
Bad counts, an unknown snapshot and another team's are clear 4xx with E2B's body."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox

from tests.e2e.conftest import AENV, Stack
from tests.e2e.test_two_nodes import _node_of, _second_node, _template_durable
from tests.support import eventually_sync

pytestmark = pytest.mark.vm

CHILDREN = int(os.environ.get("AENV_SNAPSHOT_FORK_CHILDREN", "6"))


def _rival_key(stack: Stack) -> str:
    out = subprocess.run(
        [*AENV, "keys", "create", "--team", "fork-rival", "--data-dir", str(stack.data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def _refusals(stack: Stack, name: str) -> None:
    """Bad counts, an unknown snapshot and another team's: 4xx with `{code, message}`."""
    with httpx.Client(
        base_url=stack.api_url, timeout=60, headers={"X-API-KEY": stack.api_key}
    ) as c:
        for bad in (0, 101):
            r = c.post(f"/snapshots/{name}/fork", json={"count": bad})
            assert r.status_code == 400, r.text
            assert r.json()["code"] == 400 and "Count" in r.json()["message"]
        r = c.post("/snapshots/no-such-snapshot/fork", json={"count": 2})
        assert r.status_code == 404 and r.json()["code"] == 404, r.text
        r = c.post(f"/snapshots/other-team/{name}/fork", json={"count": 2})
        assert r.status_code == 404, r.text
    rival = _rival_key(stack)
    eventually_sync(  # the key reaches the API's read model, then the snapshot is not theirs
        lambda: (
            httpx.post(
                f"{stack.api_url}/snapshots/{name}/fork",
                json={"count": 1},
                headers={"X-API-KEY": rival},
                timeout=60,
            ).status_code
            == 404
        ),
        timeout=30,
    )


def test_a_snapshot_forks_into_children_on_both_nodes(stack: Stack, n2: Path) -> None:
    name = f"rl-{uuid.uuid4().hex[:8]}"
    kids: list[str] = []
    with _second_node(stack, n2):
        src = Sandbox.create(timeout=600)
        try:
            src.files.write("/home/user/prepared.txt", "prepared before the snapshot")
            src.commands.run("sleep 100000 >/dev/null 2>&1 &")
            sleeper = src.commands.run("pgrep -x sleep").stdout.split()
            assert len(sleeper) == 1
            src.create_snapshot(name=name)
            eventually_sync(lambda: _template_durable(stack, name), timeout=180, interval=1)
        finally:
            src.kill()  # the prepared state lives on in the snapshot alone (E2B's RFC flow)
        try:
            _refusals(stack, name)
            t0 = time.monotonic()
            r = httpx.post(
                f"{stack.api_url}/snapshots/{name}/fork",
                json={"count": CHILDREN, "timeout": 600},
                headers={"X-API-KEY": stack.api_key},
                timeout=600,
            )
            took = time.monotonic() - t0
            assert r.status_code == 201, r.text
            results = r.json()
            kids = [x["sandbox"]["sandboxID"] for x in results if "sandbox" in x]
            assert len(results) == CHILDREN
            assert len(kids) == CHILDREN, [x for x in results if "sandbox" not in x]
            nodes = Counter(_node_of(stack, k) for k in kids)
            print(f"snapshot fork: {CHILDREN} children in {took:.1f} s on {dict(nodes)}")
            assert set(nodes) == {"e2e", "e2e-two"}, nodes
            # restored copy-on-write: a child's VM has no RAM file of its own (a warm VM
            # handed over would: it was restored before anyone asked, under its own id)
            dirs = [
                d
                for k in kids
                for d in (stack.data_dir / "node" / "vms" / k, n2 / "node" / "vms" / k)
                if d.is_dir()
            ]
            assert dirs and not [d for d in dirs if (d / "mem").exists()], dirs

            def check(i_kid: tuple[int, str]) -> None:
                i, kid = i_kid
                sbx = Sandbox.connect(kid, timeout=600)
                assert sbx.files.read("/home/user/prepared.txt") == "prepared before the snapshot"
                assert sbx.commands.run("pgrep -x sleep").stdout.split() == sleeper
                sbx.files.write("/home/user/mine.txt", f"child-{i}")
                assert sbx.get_info().template_id == name

            with ThreadPoolExecutor(4) as pool:
                list(pool.map(check, enumerate(kids)))
            for i, kid in enumerate(kids[:3]):  # each diverged alone
                mine = Sandbox.connect(kid, timeout=600).files.read("/home/user/mine.txt")
                assert mine == f"child-{i}"
        finally:
            for k in kids:
                Sandbox.kill(k)
            Sandbox.delete_snapshot(name)


def test_a_node_lost_mid_fork_leaves_no_child_creating(stack: Stack, n2: Path) -> None:
    """The node holding the snapshot is killed while it restores its share of a fork: the
    call still answers every child — the ones it had claimed failed by the fleet timer's
    lost-node rule (an event, not `creating` for ever), the others started on the node
    left, which pulls the capture from the repository. None is a 504."""
    name = f"rl-lost-{uuid.uuid4().hex[:8]}"
    count = 6
    with _second_node(stack, n2, AENV_HEARTBEAT_S="0.5") as node:
        src = node.place()  # the snapshot is taken (and held) on the second node
        try:
            src.files.write("/home/user/prepared.txt", "prepared before the snapshot")
            src.create_snapshot(name=name)
            eventually_sync(lambda: _template_durable(stack, name), timeout=180, interval=1)
        finally:
            src.kill()
        vms = n2 / "node" / "vms"
        before = {p.name for p in vms.glob("*")} if vms.is_dir() else set()
        started: list[str] = []
        try:
            with ThreadPoolExecutor(1) as pool:
                t0 = time.monotonic()
                fork = pool.submit(
                    httpx.post,
                    f"{stack.api_url}/snapshots/{name}/fork",
                    json={"count": count, "timeout": 600},
                    headers={"X-API-KEY": stack.api_key},
                    timeout=600,
                )

                def restoring() -> bool:  # a child's VM is starting on the second node
                    now = {p.name for p in vms.glob("*")} if vms.is_dir() else set()
                    return any(not n.startswith("warm-") for n in now - before)

                eventually_sync(restoring, timeout=120, interval=0.05)
                node.die()
                r = fork.result()
                took = time.monotonic() - t0
            assert r.status_code == 201, r.text
            results = r.json()
            assert len(results) == count
            started = [x["sandbox"]["sandboxID"] for x in results if "sandbox" in x]
            failed = [x["error"] for x in results if "error" in x]
            print(f"lost mid-fork: {len(started)} started, {len(failed)} failed in {took:.1f} s")
            for e in failed:
                print(f"  failed: {e['code']} {e['message']}")
            assert all(e["code"] != 504 for e in failed), failed
            # one that finished on the second node just before it died goes with it (lost)
            alive = [k for k in started if _node_of(stack, k) == "e2e"]
            assert alive, "no child started on the node left"
            for kid in alive:
                sbx = Sandbox.connect(kid, timeout=600)
                assert sbx.files.read("/home/user/prepared.txt") == "prepared before the snapshot"

            def live() -> list[str]:  # the children the team's listing still shows
                listed = httpx.get(
                    f"{stack.api_url}/v2/sandboxes",
                    params={"state": "running,paused"},
                    headers={"X-API-KEY": stack.api_key},
                    timeout=60,
                ).json()
                return sorted(s["sandboxID"] for s in listed if s["templateID"] == name)

            # nothing else of the fork lives on: not one child left creating or running
            # on the dead node once the timer has ruled on it
            eventually_sync(lambda: live() == sorted(alive), timeout=120, interval=1)
        finally:
            for k in started:
                Sandbox.kill(k)
            Sandbox.delete_snapshot(name)
