"""Fork through the SDK: one running sandbox branches into children that share its files,
processes and memory at the moment of the fork, then diverge independently."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from e2b import Sandbox

from bus import BusSettings
from tests.e2e.conftest import Stack
from tests.series import node_url, scrape
from tests.support import eventually_sync

pytestmark = pytest.mark.vm

CHILDREN = int(os.environ.get("AENV_FORK_CHILDREN", "16"))
#: QEMU's own code and libraries, mapped by every QEMU: ~22 MiB of each one's shared pages
#: (bench/density_bench.py: 22 MiB per template sandbox, 56 per idle fork child)
QEMU_SHARED = 32 << 20


def _guest_memory(stack: Stack) -> dict[str, float]:
    """The node's `aenv_node_guest_*` series now (issue 33), by kind; `ram`: nominal."""
    token = json.loads((stack.data_dir / "stack.json").read_text())["metrics_token"]
    s = scrape(node_url(BusSettings(nats_url=stack.nats_url), "e2e"), token)
    out = {dict(k[1])["kind"]: v for k, v in s.items() if k[0] == "aenv_node_guest_memory_bytes"}
    return {**out, "ram": s[("aenv_node_guest_ram_bytes", frozenset({("node", "e2e")}))]}


def test_fork_children_inherit_state_and_diverge(stack: Stack) -> None:
    parent = Sandbox.create(timeout=600)
    kids: list[Sandbox] = []
    try:
        parent.files.write("/home/user/prefork.txt", "from-parent")
        parent.commands.run("sleep 100000 >/dev/null 2>&1 &")
        sleeper = parent.commands.run("pgrep -x sleep").stdout.split()
        assert len(sleeper) == 1

        results = parent.fork(count=CHILDREN, timeout=300)
        assert len(results) == CHILDREN
        kids = [r for r in results if isinstance(r, Sandbox)]
        assert len(kids) == CHILDREN, [r for r in results if not isinstance(r, Sandbox)]
        ids = {k.sandbox_id for k in kids}
        assert len(ids) == CHILDREN and parent.sandbox_id not in ids
        tokens = {k._envd_access_token for k in kids}
        assert len(tokens) == CHILDREN and parent._envd_access_token not in tokens

        def check(i_kid: tuple[int, Sandbox]) -> None:
            i, kid = i_kid
            assert kid.files.read("/home/user/prefork.txt") == "from-parent"
            assert kid.commands.run("pgrep -x sleep").stdout.split() == sleeper
            kid.files.write("/home/user/mine.txt", f"child-{i}")

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(check, enumerate(kids)))
        # the children map the fork's capture copy-on-write: the node's series show pages
        # they share beyond QEMU's own code (sandboxes with RAM files of their own do not)
        mem = _guest_memory(stack)
        vms = mem["ram"] / (512 << 20)
        assert vms >= CHILDREN + 1, mem
        assert mem["shared"] > vms * QEMU_SHARED, mem
        assert mem["pss"] < mem["rss"] and mem["shared"] + mem["private"] == mem["rss"], mem
        for i, kid in enumerate(kids):
            assert kid.files.read("/home/user/mine.txt") == f"child-{i}"
            assert kid.get_info().sandbox_id == kid.sandbox_id
        # the parent is unaffected: still running, same process, none of the children's files
        assert not parent.files.exists("/home/user/mine.txt")
        assert parent.commands.run("pgrep -x sleep").stdout.split() == sleeper
        assert parent.get_info().state.value == "running"
    finally:
        for k in kids:
            k.kill()
        parent.kill()


def test_fork_rejects_bad_counts_and_paused_parents(stack: Stack) -> None:
    sbx = Sandbox.create()
    h = {"X-API-KEY": stack.api_key}
    try:
        with httpx.Client(base_url=stack.api_url, timeout=60) as c:
            for bad in (0, 101):
                r = c.post(f"/sandboxes/{sbx.sandbox_id}/fork", json={"count": bad}, headers=h)
                assert r.status_code == 400 and "fork count" in r.json()["message"]
            assert sbx.pause()
            r = c.post(f"/sandboxes/{sbx.sandbox_id}/fork", json={"count": 1}, headers=h)
            assert r.status_code == 409 and r.json()["code"] == 409
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_fork_capture_is_freed_after_its_last_running_child(stack: Stack) -> None:
    """The capture a fork makes (its RAM file is what the children map) is deleted once no
    child runs; a paused child never needs it again and resumes intact (its pause streamed
    its RAM into the state, which the resume loads into a RAM file of its own)."""
    snaps = stack.data_dir / "node" / "snapshots"
    parent = Sandbox.create(timeout=300)
    kids: list[Sandbox] = []
    try:
        parent.files.write("/home/user/prefork.txt", "from-parent")
        before = set(os.listdir(snaps))
        kids = [r for r in parent.fork(count=2, timeout=120) if isinstance(r, Sandbox)]
        assert len(kids) == 2
        (capture,) = set(os.listdir(snaps)) - before
        kids[0].files.write("/home/user/mine.txt", "child-0")
        kids[0].pause()
        assert (snaps / capture).exists()  # child 1 still maps it
        kids[1].kill()
        eventually_sync(lambda: not (snaps / capture).exists(), timeout=30, interval=0.2)
        back = Sandbox.connect(kids[0].sandbox_id, timeout=120)
        assert back.files.read("/home/user/mine.txt") == "child-0"
        assert back.files.read("/home/user/prefork.txt") == "from-parent"
        # resumed, the child owns its RAM file: it pauses and resumes like any sandbox
        back.files.write("/home/user/second.txt", "cycle-2")
        back.pause()
        again = Sandbox.connect(kids[0].sandbox_id, timeout=120)
        assert again.files.read("/home/user/second.txt") == "cycle-2"
        assert again.files.read("/home/user/mine.txt") == "child-0"
    finally:
        for k in kids:
            k.kill()
        parent.kill()
