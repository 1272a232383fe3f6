"""Crashes of one role process, and traffic to paused sandboxes, through the real SDK.

`aenv up` runs two supervised processes (api, node) over one bus: killing either must lose
nothing the event log knows about. These tests SIGKILL them on purpose, so they read the
role pids from the stack's stack.json (the supervisor rewrites it after a restart).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import threading

import httpx
import nats
import pytest
from e2b import Sandbox, SandboxState

from domain import sandbox as sb
from tests.e2e.conftest import Stack
from tests.eventwatch import FirstEvent
from tests.support import eventually_sync

pytestmark = pytest.mark.vm


def _role_pid(stack: Stack, role: str) -> int:
    return int(json.loads((stack.data_dir / "stack.json").read_text())["roles"][role])


def _api_up(stack: Stack) -> bool:
    return httpx.get(f"{stack.api_url}/health", timeout=2).status_code < 500


def _ids() -> set[str]:
    return {s.sandbox_id for s in Sandbox.list(limit=100).next_items()}


def test_api_killed_mid_create_the_sandbox_still_appears(stack: Stack) -> None:
    """Issue 4: "API restarted mid-create → the sandbox still appears once it is created"."""
    api_pid = _role_pid(stack, "api")
    watch = FirstEvent(stack.nats_url, sb.SandboxRequested)
    outcome: list[BaseException | Sandbox] = []

    def create() -> None:
        try:
            outcome.append(Sandbox.create(timeout=120))
        except BaseException as e:
            outcome.append(e)

    t = threading.Thread(target=create)
    t.start()
    assert watch.seen.wait(30), "the node never took the create"
    os.kill(api_pid, signal.SIGKILL)  # while the VM restores
    t.join(60)
    assert outcome and not isinstance(outcome[0], Sandbox), "the create should have been cut"
    eventually_sync(lambda: _api_up(stack) and _role_pid(stack, "api") != api_pid, timeout=60)
    sid = watch.sandbox_id
    assert sid is not None
    eventually_sync(lambda: Sandbox.get_info(sid).state == SandboxState.RUNNING, timeout=60)
    sbx = Sandbox.connect(sid)
    assert sbx.commands.run("echo survived").stdout == "survived\n"
    assert sbx.kill()


def test_node_killed_paused_sandboxes_survive_running_ones_are_reported(stack: Stack) -> None:
    """A node crash loses running VMs (said in the log) but no paused sandbox."""
    paused = Sandbox.create(timeout=300)
    paused.files.write("/home/user/keep.txt", "kept across a node crash")
    paused.pause()
    running = Sandbox.create(timeout=300)
    node_pid = _role_pid(stack, "node")
    os.kill(node_pid, signal.SIGKILL)
    eventually_sync(lambda: _role_pid(stack, "node") != node_pid, timeout=120, interval=0.2)
    # the restarted node reconciles: the running one's VM died with it -> killed, with reason
    eventually_sync(lambda: running.sandbox_id not in _ids(), timeout=60, interval=0.2)
    back = Sandbox.connect(paused.sandbox_id, timeout=300)
    assert back.files.read("/home/user/keep.txt") == "kept across a node crash"
    assert back.kill()


def test_auto_resume_on_traffic_and_502_without_it(stack: Stack) -> None:
    auto = Sandbox.create(timeout=300, lifecycle={"on_timeout": "pause", "auto_resume": True})
    plain = Sandbox.create(timeout=300)
    try:
        auto.commands.run("echo 7 > /tmp/seven")
        auto.pause()
        plain.pause()
        # envd traffic to a paused auto-resume sandbox wakes it (no connect call)
        assert auto.commands.run("cat /tmp/seven").stdout == "7\n"
        assert auto.get_info().state == SandboxState.RUNNING
        # without autoResume: E2B's "sandbox was not found" (502), and it stays paused
        r = httpx.get(
            f"{stack.api_url}/health",
            headers={"E2b-Sandbox-Id": plain.sandbox_id, "E2b-Sandbox-Port": "49983"},
        )
        assert r.status_code == 502
        assert "not found" in r.json()["message"]
        assert plain.get_info().state == SandboxState.PAUSED
    finally:
        auto.kill()
        plain.kill()


def _life_of(stack: Stack, key: str, value: str) -> list[str]:
    """Event types of the sandbox whose metadata has key=value, read from the log."""
    from bus import BusSettings
    from projections.audit import read_log

    async def run() -> list[str]:
        nc = await nats.connect(stack.nats_url)
        try:
            recs = await read_log(nc.jetstream(), BusSettings(nats_url=stack.nats_url))
        finally:
            await nc.close()
        sid = next(
            (
                r.envelope.aggregate_id
                for r in recs
                if isinstance(r.event, sb.SandboxRequested)
                and r.event.spec.metadata.get(key) == value
            ),
            None,
        )
        return [type(r.event).__name__ for r in recs if r.envelope.aggregate_id == sid]

    return asyncio.run(run())


def _post_and_hang_up(api_url: str, path: str, headers: dict[str, str], body: object) -> None:
    """Send a whole request and close the connection at once, reading nothing: a client
    that went away. (A client timeout of a fraction of a second did it once, but a create
    the warm pool hands over answers within that.)"""
    host, port = httpx.URL(api_url).host, httpx.URL(api_url).port
    data = json.dumps(body).encode()
    head = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}:{port}",
        "Content-Type: application/json",
        f"Content-Length: {len(data)}",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    with socket.create_connection((host, port or 80), timeout=10) as s:
        s.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + data)


def test_a_create_whose_client_hung_up_is_killed(stack: Stack) -> None:
    """Issue 16: a client that hangs up on a create never learns the sandbox's id; the
    sandbox must not live out its TTL. With an idempotency key it stays (a retry claims it)."""
    tag = os.urandom(6).hex()
    headers = {"X-API-Key": stack.api_key}
    for key, extra in (("hangup", {}), ("keyed", {"Idempotency-Key": tag})):
        _post_and_hang_up(
            stack.api_url,
            "/sandboxes",
            {**headers, **extra},
            {"templateID": "base", "metadata": {key: tag}},
        )
    eventually_sync(lambda: "SandboxKilled" in _life_of(stack, "hangup", tag), timeout=60)
    assert "SandboxCreated" in _life_of(stack, "hangup", tag)  # it came up, then went
    kept = eventually_sync(
        lambda: "SandboxCreated" in (life := _life_of(stack, "keyed", tag)) and life, timeout=60
    )
    assert "SandboxKillRequested" not in kept
    again = httpx.post(
        f"{stack.api_url}/sandboxes",
        headers={**headers, "Idempotency-Key": tag},
        json={"templateID": "base", "metadata": {"keyed": tag}},
        timeout=60,
    )
    assert again.status_code == 201
    Sandbox.kill(again.json()["sandboxID"])
