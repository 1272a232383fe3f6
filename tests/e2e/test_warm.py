"""The warm pool through the unchanged SDK (issue 19): creates hand over VMs restored and
warmed before the request — each its own sandbox (entropy, clock, env vars, token), none
reachable before its claim, a dead one replaced, a deleted template's pool drained, and a
burst larger than the pool served cold."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from e2b import Sandbox

from bus import BusSettings
from tests.e2e.conftest import AENV, Stack
from tests.e2e.warmpool import node_warm
from tests.series import Samples, node_url, scrape
from tests.support import eventually_sync

pytestmark = pytest.mark.vm

ENVD = "49983"


def _beat_warm(stack: Stack) -> dict[str, int]:
    """What the node's heartbeat says its pool holds (template → warm VMs): every few
    seconds, so a moment behind."""
    from aenv.ops.fleet import read_beats

    beats = asyncio.run(read_beats(stack.nats_url))
    assert len(beats) == 1, beats
    return dict(beats[0].warm)


def _warm_dirs(stack: Stack) -> set[str]:
    """Ids of the warm VMs on the node's disk (their directories, `warm-…` until claimed)."""
    return {p.name for p in (stack.data_dir / "node" / "vms").glob("warm-*") if p.is_dir()}


def _pool_has(stack: Stack, template: str, n: int = 1, timeout: float = 120) -> None:
    eventually_sync(lambda: node_warm(stack).get(template, 0) >= n, timeout=timeout, interval=0.2)


def _created_warm(stack: Stack, sandbox_id: str) -> bool:
    """The `warm` flag of the sandbox's SandboxCreated, from the log."""
    from bus import Bus, BusSettings
    from domain import sandbox as sb

    async def read() -> bool:
        bus = await Bus.connect(BusSettings(nats_url=stack.nats_url), setup=False)
        try:
            for rec in await bus.sandboxes.read(sandbox_id):
                if isinstance(rec.event, sb.SandboxCreated):
                    return rec.event.warm
            raise AssertionError(f"no SandboxCreated for {sandbox_id}")
        finally:
            await bus.close()

    return asyncio.run(read())


def _envd_get(stack: Stack, sandbox_id: str, token: str | None) -> int:
    headers = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": ENVD}
    if token is not None:
        headers["X-Access-Token"] = token
    r = httpx.get(
        f"{stack.api_url}/files", params={"path": "/etc/hostname"}, headers=headers, timeout=30
    )
    return r.status_code


def test_sandboxes_from_one_pool_are_each_their_own(stack: Stack) -> None:
    _pool_has(stack, "base")
    a = Sandbox.create(timeout=300, envs={"WHO": "a"})
    _pool_has(stack, "base")
    b = Sandbox.create(timeout=300, envs={"WHO": "b"})
    try:
        assert _created_warm(stack, a.sandbox_id) and _created_warm(stack, b.sandbox_id)
        for sbx in (a, b):  # a claimed VM's directory is the sandbox's, like a restored one's
            assert (stack.data_dir / "node" / "vms" / sbx.sandbox_id / "qemu.pid").exists()
        probe = (
            "head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; "
            "python3 -c 'import uuid; print(uuid.uuid4())'; echo $WHO; hostname; "
            "date +%s.%N"
        )
        seen = {}
        for sbx in (a, b):
            before = time.time()
            out = sbx.commands.run(probe).stdout.split()
            after = time.time()
            rand, uid, who, host, clock = out
            assert before - 1 <= float(clock) <= after + 1, (before, clock, after)
            assert host == sbx.sandbox_id
            seen[who] = (rand, uid)
        assert set(seen) == {"a", "b"}  # each got the env vars its create asked for
        assert seen["a"][0] != seen["b"][0], "both read the same bytes from /dev/urandom"
        assert seen["a"][1] != seen["b"][1], "both made the same uuid4"
        # the token is the one its create answered: a wrong one (or another's) is refused
        token_a = a._envd_access_token
        token_b = b._envd_access_token
        assert token_a and token_b and token_a != token_b
        assert _envd_get(stack, a.sandbox_id, token_a) == 200
        assert _envd_get(stack, a.sandbox_id, token_b) == 401
        assert _envd_get(stack, a.sandbox_id, "not-the-token") == 401
        assert _envd_get(stack, a.sandbox_id, None) == 401

        # its log starts at its claim: the warm-up before (a login bash running `true`)
        # was nobody's sandbox
        def logs() -> str | None:
            out = subprocess.run(
                [*AENV, "logs", a.sandbox_id],
                env={**os.environ, **stack.env()},
                capture_output=True,
                text=True,
                timeout=60,
            ).stdout
            return out if "head -c 32" in out else None

        text = eventually_sync(logs, timeout=30, interval=1)
        assert text is not None and "-c true" not in text, text
    finally:
        a.kill()
        b.kill()


def test_a_warm_vm_is_unreachable_before_its_claim(stack: Stack) -> None:
    _pool_has(stack, "base")
    warm = sorted(_warm_dirs(stack))
    assert warm, "the heartbeat says warm, the disk shows none"
    for vm_id in warm:
        headers = {"E2b-Sandbox-Id": vm_id, "E2b-Sandbox-Port": ENVD}
        r = httpx.get(f"{stack.api_url}/health", headers=headers, timeout=30)
        assert r.status_code == 502, (vm_id, r.status_code, r.text)
        assert "not found" in r.text.lower()


def test_a_warm_vm_that_dies_is_replaced(stack: Stack) -> None:
    _pool_has(stack, "base")
    victim = sorted(_warm_dirs(stack))[0]
    pid = int((stack.data_dir / "node" / "vms" / victim / "qemu.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    eventually_sync(lambda: victim not in _warm_dirs(stack), timeout=30)
    _pool_has(stack, "base")
    assert _warm_dirs(stack) - {victim}
    sbx = Sandbox.create(timeout=120)  # and the pool still serves
    try:
        assert sbx.commands.run("echo ok").stdout.strip() == "ok"
    finally:
        sbx.kill()


def test_a_snapshot_template_gets_a_pool_and_its_delete_drains_it(stack: Stack) -> None:
    src = Sandbox.create(timeout=300)
    src.files.write("/home/user/task.txt", "prepared")
    snap = src.create_snapshot()
    src.kill()
    name = snap.snapshot_id
    first = Sandbox.create(name, timeout=120)  # demand: the pool starts keeping its VMs
    first.kill()
    _pool_has(stack, name)
    second = Sandbox.create(name, timeout=120)
    try:
        assert _created_warm(stack, second.sandbox_id)
        assert second.files.read("/home/user/task.txt") == "prepared"
    finally:
        second.kill()
    _pool_has(stack, name)
    before, held = _warm_dirs(stack), node_warm(stack)[name]
    assert Sandbox.delete_snapshot(name)
    eventually_sync(lambda: name not in node_warm(stack), timeout=60, interval=0.5)
    eventually_sync(lambda: name not in _beat_warm(stack), timeout=30, interval=0.5)
    # its VMs went (the base pool may have grown meanwhile: count what left)
    eventually_sync(lambda: len(before - _warm_dirs(stack)) >= held, timeout=30, interval=0.5)


def _scrape(stack: Stack) -> Samples:
    token = json.loads((stack.data_dir / "stack.json").read_text())["metrics_token"]
    return scrape(node_url(BusSettings(nats_url=stack.nats_url), "e2e"), token)


def _claims(samples: Samples, result: str) -> float:
    return samples.get(
        ("aenv_node_warm_claims_total", frozenset({"node": "e2e", "result": result}.items())), 0.0
    )


def test_a_burst_larger_than_the_pool_falls_back_to_cold_creates(stack: Stack) -> None:
    n = 6
    _pool_has(stack, "base")
    before = _scrape(stack)
    assert before[("aenv_node_warm_vms", frozenset({"node": "e2e", "template": "base"}.items()))]
    assert before[("aenv_node_warm_rss_bytes", frozenset({"node": "e2e"}.items()))] > 16 << 20
    assert before[("aenv_node_warm_memory_mib", frozenset({"node": "e2e"}.items()))] >= 512
    with ThreadPoolExecutor(n) as ex:
        made = list(ex.map(lambda i: Sandbox.create(timeout=120, envs={"I": str(i)}), range(n)))
    try:
        for i, sbx in enumerate(made):
            assert sbx.commands.run("echo $I").stdout.strip() == str(i)
        warm = [_created_warm(stack, s.sandbox_id) for s in made]
        assert any(warm) and not all(warm), warm  # some handed over, the rest restored
        after = _scrape(stack)  # the node counted them as the log says
        assert _claims(after, "hit") - _claims(before, "hit") == sum(warm)
        assert _claims(after, "miss") - _claims(before, "miss") == n - sum(warm)
    finally:
        for sbx in made:
            sbx.kill()
