"""The control plane end to end without VMs: the E2B SDK and HTTP against the real API,
commands over NATS to the real node worker (its host in memory), events folded by the real
projections. create → pause → resume → fork → kill, what each step leaves in the read
models and in the log, and the answers a client gets when a node refuses."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox

from aenv.logformat import marks
from bus import Bus
from domain import sandbox as sb
from tests.vmless.conftest import VmlessStack


def _history(stack: VmlessStack, sandbox_id: str) -> list[str]:
    async def read() -> list[str]:
        bus = await Bus.connect(stack.bus_settings, setup=False)
        try:
            return [type(r.event).__name__ for r in await bus.sandboxes.read(sandbox_id)]
        finally:
            await bus.close()

    return asyncio.run(read())


pytestmark = pytest.mark.usefixtures("sdk_env")


def test_create_pause_resume_fork_kill(vmless: VmlessStack) -> None:
    t0 = time.monotonic()
    sbx = Sandbox.create(timeout=120, metadata={"run": "vmless"})
    sid = sbx.sandbox_id
    with vmless.client() as c:
        assert c.get(f"/sandboxes/{sid}").json()["state"] == "running"
        sbx.pause()
        assert c.get(f"/sandboxes/{sid}").json()["state"] == "paused"
        back = Sandbox.connect(sid, timeout=120)
        assert back.get_info().state == "running"
        r = c.post(f"/sandboxes/{sid}/fork", json={"count": 3})
        assert r.status_code == 201, r.text
        children = [item["sandbox"]["sandboxID"] for item in r.json()]
        assert len(set(children)) == 3
        listed = c.get("/v2/sandboxes", params={"metadata": "run=vmless"}).json()
        assert {s["sandboxID"] for s in listed} == {sid, *children}
        for child in children:  # each child is a sandbox of its own, with its lineage
            assert c.get(f"/sandboxes/{child}").json()["state"] == "running"
            assert _history(vmless, child)[:2] == ["SandboxRequested", "SandboxCreated"]
        for s in (sid, *children):
            assert c.delete(f"/sandboxes/{s}").status_code == 204
            assert c.get(f"/sandboxes/{s}").status_code == 404
    assert _history(vmless, sid) == [
        "SandboxRequested",
        "SandboxCreated",
        "SandboxPauseRequested",
        "SandboxPaused",
        "SandboxResumeRequested",
        "SandboxResumed",
        "SandboxForkRequested",
        "SandboxForked",
        "SandboxKillRequested",
        "SandboxKilled",
    ]
    assert time.monotonic() - t0 < 60


def test_connects_racing_on_a_paused_sandbox_each_find_it_running(vmless: VmlessStack) -> None:
    """Eight clients connect to one paused sandbox at once (an SDK, the proxy's
    auto-resume, a trainer's retry): one request resumes it, and every other is answered
    with the sandbox running, never a 409 from the resume it lost to. One resume, one
    outcome in the log."""
    sbx = Sandbox.create(timeout=120)
    sid = sbx.sandbox_id
    for _ in range(3):  # the race is a few milliseconds wide: more than one go at it
        sbx.pause()
        with ThreadPoolExecutor(8) as pool, vmless.client() as c:
            go = threading.Barrier(8)

            def connect(_: int, c: httpx.Client = c, go: threading.Barrier = go) -> httpx.Response:
                go.wait()
                return c.post(f"/sandboxes/{sid}/connect", json={"timeout": 120})

            answers = list(pool.map(connect, range(8)))
        assert all(r.status_code in (200, 201) for r in answers), [
            (r.status_code, r.text) for r in answers
        ]
        assert {r.json()["sandboxID"] for r in answers} == {sid}
        with vmless.client() as c:
            assert c.get(f"/sandboxes/{sid}").json()["state"] == "running"
    names = _history(vmless, sid)
    assert names.count("SandboxResumeRequested") == names.count("SandboxResumed") == 3, names
    Sandbox.kill(sid)


def test_a_paused_sandbox_shows_the_time_it_keeps(vmless: VmlessStack) -> None:
    """Its `endAt` is the end it had when paused (paused time does not bring it closer), so
    aenv's own `pausedAt` and `remainingS` say what it runs once resumed — the same in the
    detail and the listing, unchanged while it stays paused; a sandbox its timeout paused
    gets its whole timeout again (issue 18: `aenv ls` showed `-19m08s`)."""
    sbx = Sandbox.create(timeout=600)
    expired = Sandbox.create(timeout=3, lifecycle={"on_timeout": "pause"})
    with vmless.client() as c:
        assert "remainingS" not in c.get(f"/sandboxes/{sbx.sandbox_id}").json()
        sbx.pause()
        first = c.get(f"/sandboxes/{sbx.sandbox_id}").json()
        assert 580 <= first["remainingS"] <= 600 and first["pausedAt"], first
        time.sleep(2)
        later = c.get(f"/sandboxes/{sbx.sandbox_id}").json()
        assert later["remainingS"] == first["remainingS"]
        listed = {s["sandboxID"]: s for s in c.get("/v2/sandboxes").json()}
        assert listed[sbx.sandbox_id]["remainingS"] == first["remainingS"]
        deadline = time.monotonic() + 20
        while Sandbox.get_info(expired.sandbox_id).state != "paused":
            assert time.monotonic() < deadline, "the TTL did not pause the sandbox"
            time.sleep(0.2)
        assert c.get(f"/sandboxes/{expired.sandbox_id}").json()["remainingS"] == 3
        # a resume without a timeout (the resume route, the proxy's auto-resume) gives it
        # what it kept (the SDK's `connect` asks for 300 s unless told: `aenv` tells it)
        assert c.post(f"/sandboxes/{sbx.sandbox_id}/resume").status_code == 201
        end = datetime.fromisoformat(c.get(f"/sandboxes/{sbx.sandbox_id}").json()["endAt"])
        left = (end - datetime.now(UTC)).total_seconds()
        assert abs(left - first["remainingS"]) < 10, (left, first)
        assert "remainingS" not in c.get(f"/sandboxes/{sbx.sandbox_id}").json()
    for s in (sbx.sandbox_id, expired.sandbox_id):
        Sandbox.kill(s)


def test_refusals_are_answered_not_timed_out(vmless: VmlessStack) -> None:
    """The node decides again on the log, so what the API checks early still ends in a
    clear 4xx: fork of a paused sandbox whose capture is not durable 409 (this stack
    has no repository), a bad count 400, an unknown sandbox 404."""
    sbx = Sandbox.create(timeout=120)
    with vmless.client() as c:
        assert c.post(f"/sandboxes/{sbx.sandbox_id}/fork", json={"count": 17}).status_code == 400
        r = c.post(f"/sandboxes/{sbx.sandbox_id}/snapshots", json={"name": "paused-x"})
        assert r.status_code == 400 and "reserved" in r.json()["message"], r.text
        sbx.pause()
        r = c.post(f"/sandboxes/{sbx.sandbox_id}/fork", json={"count": 2})
        assert r.status_code == 409 and r.json()["code"] == 409, r.text
        assert c.post("/sandboxes/nosuchsandbox0000000/pause").status_code == 404
        assert c.delete(f"/sandboxes/{sbx.sandbox_id}").status_code == 204


def test_the_timer_pauses_a_sandbox_whose_ttl_ran_out(vmless: VmlessStack) -> None:
    sbx = Sandbox.create(timeout=2, lifecycle={"on_timeout": "pause"})
    deadline = time.monotonic() + 20
    while Sandbox.get_info(sbx.sandbox_id).state != "paused":
        assert time.monotonic() < deadline, "the TTL did not pause the sandbox"
        time.sleep(0.2)
    assert _history(vmless, sbx.sandbox_id)[-1] == "SandboxPaused"
    assert Sandbox.connect(sbx.sandbox_id, timeout=60).get_info().state == "running"
    sbx.kill()


def test_a_template_import_a_node_refuses_is_answered_with_its_reason(
    vmless: VmlessStack, tmp_path: Path
) -> None:
    """`aenv pull` of something that is not an OCI image: the node refuses the import and
    the refusal lands on the template's subject, where the builder waits — the user hears
    why at once (before, it landed on a sandbox subject and the build waited out its
    import timeout)."""
    bogus = tmp_path / "not-an-image"
    bogus.mkdir()
    (bogus / "README").write_text("no oci-layout here")
    t0 = time.monotonic()
    out = vmless.aenv("pull", str(bogus), "-n", "bogus-image", timeout=60)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "not an OCI image layout" in out.stdout + out.stderr
    assert time.monotonic() - t0 < 30


def _second_node(stack: VmlessStack, data: Path) -> subprocess.Popen[str]:
    env = {**stack.env, "AENV_NODE_ID": "vmless-two", "AENV_DATA_DIR": str(data)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "aenv.serve", "node"], env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if marks(line, "ROLE-READY"):
            return proc
    pytest.fail(f"second node exited during start-up ({proc.wait()})")


def test_a_paused_sandbox_stranded_on_a_gone_node_is_refused_at_once(
    vmless: VmlessStack, tmp_path: Path
) -> None:
    """No repository in this stack: a capture on a node that stopped beating cannot move.
    The resume route and the proxy's auto-resume share one resume policy, so both answer
    at once (503; E2B's 502 through the proxy) instead of waiting on a dead node's queue."""
    node = _second_node(vmless, tmp_path / "two")
    placed: list[Sandbox] = []
    try:
        with vmless.client() as c:
            for _ in range(40):  # placement is whoever pulls first: node two gets one soon
                sbx = Sandbox.create(
                    timeout=120, lifecycle={"on_timeout": "pause", "auto_resume": True}
                )
                placed.append(sbx)
                if c.get(f"/sandboxes/{sbx.sandbox_id}").json()["nodeID"] == "vmless-two":
                    break
            else:
                pytest.fail("no create was placed on the second node")
            sbx.pause()
            node.kill()  # no goodbye; gone after 3 missed beats (0.5 s each)
            node.wait(10)
            time.sleep(2.0)
            t0 = time.monotonic()
            r = c.post(f"/sandboxes/{sbx.sandbox_id}/connect", json={"timeout": 60})
            assert r.status_code == 503 and "not running" in r.json()["message"], r.text
            proxied = c.get(
                "/health", headers={"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983"}
            )
            assert proxied.status_code == 502, proxied.text
            assert time.monotonic() - t0 < 10  # not a command timeout
            for s in placed:  # a kill of a sandbox on a gone node completes in the log
                assert c.delete(f"/sandboxes/{s.sandbox_id}").status_code == 204
    finally:
        if node.poll() is None:
            node.kill()
            node.wait(10)


def _pause_memory(stack: VmlessStack, sandbox_id: str) -> list[tuple[str, bool]]:
    async def read() -> list[tuple[str, bool]]:
        bus = await Bus.connect(stack.bus_settings, setup=False)
        try:
            out = []
            for r in await bus.sandboxes.read(sandbox_id):
                if isinstance(r.event, sb.SandboxPauseRequested):
                    out.append(("requested", r.event.keep_memory))
                elif isinstance(r.event, sb.SandboxPaused):
                    out.append(("paused", r.event.memory))
            return out
        finally:
            await bus.close()

    return asyncio.run(read())


def test_a_filesystem_pause_is_asked_for_and_recorded(vmless: VmlessStack) -> None:
    """The SDK's `mode="filesystem"` (a pause's body, a create's `autoPauseMemory`) reaches
    the node and the log; the memory node then says the capture has no memory."""
    sbx = Sandbox.create(timeout=120)
    sbx.pause(mode="filesystem")
    assert _pause_memory(vmless, sbx.sandbox_id) == [("requested", False), ("paused", False)]
    Sandbox.connect(sbx.sandbox_id, timeout=120).pause()  # plain: with memory again
    assert _pause_memory(vmless, sbx.sandbox_id)[2:] == [("requested", True), ("paused", True)]
    Sandbox.kill(sbx.sandbox_id)
    fs_pause = {"on_timeout": {"action": "pause", "mode": "filesystem"}}
    timed = Sandbox.create(timeout=120, lifecycle=fs_pause)  # type: ignore[arg-type]
    timed.set_timeout(0)  # its timeout's pause, now
    assert _pause_memory(vmless, timed.sandbox_id) == [("requested", False), ("paused", False)]
    Sandbox.kill(timed.sandbox_id)
    with vmless.client() as c:
        both = {"autoPause": True, "autoPauseMemory": False, "autoResume": {"enabled": True}}
        r = c.post("/sandboxes", json={"templateID": "base", **both})
        assert r.status_code == 400 and "autoResume" in r.json()["message"]
