"""The unchanged `e2b` SDK (2.63) against a real aenv stack: real VMs, real envd."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest
from e2b import Sandbox, SandboxQuery, SandboxState
from e2b.exceptions import NotFoundException, SandboxException

from tests.e2e.conftest import Stack
from tests.support import eventually_sync

pytestmark = pytest.mark.vm


def test_lifecycle_through_the_sdk(stack: Stack) -> None:
    tag = uuid.uuid4().hex[:8]
    sbx = Sandbox.create(metadata={"suite": tag}, envs={"FOO": "bar"})
    try:
        r = sbx.commands.run("echo hi; echo $FOO; whoami; pwd")
        assert r.stdout.split() == ["hi", "bar", "user", "/home/user"]
        assert sbx.commands.run("exit 0").exit_code == 0

        sbx.files.write("hello.txt", "hello world")
        assert sbx.files.read("hello.txt") == "hello world"
        assert sbx.files.read("/home/user/hello.txt") == "hello world"

        info = sbx.get_info()
        assert info.sandbox_id == sbx.sandbox_id
        assert info.template_id == "base"
        assert info.state == SandboxState.RUNNING
        assert info.metadata == {"suite": tag}

        listed = Sandbox.list(query=SandboxQuery(metadata={"suite": tag})).next_items()
        assert [s.sandbox_id for s in listed] == [sbx.sandbox_id]
        none = Sandbox.list(query=SandboxQuery(metadata={"suite": tag + "x"})).next_items()
        assert none == []

        before = sbx.get_info().end_at
        sbx.set_timeout(600)
        assert sbx.get_info().end_at > before
        assert sbx.is_running()
    finally:
        assert sbx.kill() is True
    assert Sandbox.kill(sbx.sandbox_id) is False
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sbx.sandbox_id)


def test_ttl_expiry_kills_when_asked(stack: Stack) -> None:
    sbx = Sandbox.create(timeout=3, lifecycle={"on_timeout": "kill"})
    assert sbx.is_running()

    def gone() -> bool:
        return not sbx.is_running()

    eventually_sync(gone, timeout=30, interval=0.5)
    with pytest.raises((NotFoundException, SandboxException)):
        sbx.commands.run("true")


def test_errors_are_e2b_json(stack: Stack) -> None:
    h = {"X-API-KEY": stack.api_key}
    with httpx.Client(base_url=stack.api_url, timeout=30) as c:
        r = c.post("/v2/sandboxes", json={"templateID": "no-such-template"}, headers=h)
        assert r.status_code == 404 and r.json()["code"] == 404
        r = c.post("/v2/sandboxes", json={"templateID": "base", "timeout": 10**9}, headers=h)
        assert r.status_code == 400 and "timeout" in r.json()["message"]
        r = c.post("/v2/sandboxes", json={"templateID": 5}, headers=h)
        assert r.status_code == 400 and isinstance(r.json()["message"], str)
        r = c.get("/sandboxes/doesnotexist0000", headers=h)
        assert r.status_code == 404 and r.json() == {
            "code": 404,
            "message": 'sandbox "doesnotexist0000" not found',
        }
        wrong = "e2b_" + "0" * 40
        r = c.get("/v2/sandboxes", headers={"X-API-KEY": wrong})
        assert r.status_code == 401 and r.json()["code"] == 401
        r = c.get("/v2/sandboxes")
        assert r.status_code == 401
        r = c.get("/health")
        assert r.status_code == 200
        r = c.get(
            "/health", headers={"E2b-Sandbox-Id": "nosuchsandbox", "E2b-Sandbox-Port": "49983"}
        )
        assert r.status_code == 502 and "was not found" in r.json()["message"]


def test_wrong_envd_token_is_refused(stack: Stack) -> None:
    sbx = Sandbox.create()
    try:
        with httpx.Client(base_url=stack.api_url, timeout=30) as c:
            hdrs = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983"}
            r = c.post("/process.Process/List", json={}, headers={**hdrs, "X-Access-Token": "x"})
            assert r.status_code == 401
            token = sbx._envd_access_token or ""
            r = c.post("/process.Process/List", json={}, headers={**hdrs, "X-Access-Token": token})
            assert r.status_code == 200
    finally:
        sbx.kill()


def test_create_latency_is_sane(stack: Stack) -> None:
    """Not a benchmark (see bench/): a guard against a create that silently boots."""
    t0 = time.monotonic()
    sbx = Sandbox.create()
    took = time.monotonic() - t0
    sbx.kill()
    assert took < 5.0, f"create took {took:.1f}s: restore path broken?"


def test_idempotency_key_makes_a_retried_create_land_on_the_same_sandbox(stack: Stack) -> None:
    key = f"retry-{uuid.uuid4().hex[:12]}"
    first = Sandbox.create(idempotency_key=key)
    try:
        again = Sandbox.create(idempotency_key=key)
        assert again.sandbox_id == first.sandbox_id
        other = Sandbox.create(idempotency_key=key + "-other")
        assert other.sandbox_id != first.sandbox_id
        other.kill()
    finally:
        first.kill()


def test_kill_ends_streams_open_through_the_proxy(stack: Stack) -> None:
    """A foreground command streaming through the proxy ends when its sandbox is killed
    (the guest's namespace vanishes without a FIN: the proxy must close the stream)."""
    import threading

    sbx = Sandbox.create()
    outcome: list[BaseException | str] = []

    def run() -> None:
        try:
            outcome.append(sbx.commands.run("sleep 1000", timeout=0).stdout)
        except BaseException as e:
            outcome.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    eventually_sync(lambda: any(p.cmd == "/bin/bash" for p in sbx.commands.list()), timeout=20)
    t0 = time.monotonic()
    Sandbox.kill(sbx.sandbox_id)
    t.join(timeout=15)
    assert not t.is_alive(), "the streamed command hung after its sandbox was killed"
    assert time.monotonic() - t0 < 15 and isinstance(outcome[0], BaseException)
