"""Leases and bulk kill on microVMs (issue 32): what `tests/vmless/test_leases.py` and
`test_bulk.py` prove at 20 and 50 sandboxes on in-memory nodes, here with real VMs, so the
kills the log records are QEMUs that end. A trainer (`tests.vmless.lease_trainer`) holding
sandboxes under a lease, renewing it every second, is killed with SIGKILL: every sandbox is
killed within the lease's TTL + 5 s, with no call of ours, and its QEMU is gone; a bulk
kill by metadata ends every matching VM in one call and leaves the others running; a key
past its running limit (`aenv keys limits`) is refused at once, 429 with Retry-After, the
unchanged SDK raising its `RateLimitException`, while its running VMs go on.

How many: `AENV_ROLLOUT_VMS` each (the suite 4; `make test-scale` 20).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import pytest
from e2b import RateLimitException, Sandbox

from tests.e2e.conftest import AENV, Stack
from tests.support import eventually_sync
from tests.vmless.lease_trainer import start
from tests.vmless.test_leases import states

pytestmark = pytest.mark.vm

VMS = int(os.environ.get("AENV_ROLLOUT_VMS", "4"))
TTL = 3.0


def _qemu(stack: Stack, sandbox_id: str) -> int:
    return int((stack.data_dir / "node" / "vms" / sandbox_id / "qemu.pid").read_text())


def _alive(pid: int) -> bool:
    """Running, not a zombie its parent has yet to reap."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.timeout(600)
def test_a_crashed_trainers_vms_are_killed_within_the_ttl(stack: Stack) -> None:
    trainer, lease, ids = start(VMS, TTL, stack.env())
    try:
        assert len(ids) == VMS
        pids = {sid: _qemu(stack, sid) for sid in ids}
        assert all(_alive(p) for p in pids.values()), pids
        with _client(stack) as c:
            time.sleep(2 * TTL)  # renewed every second: alive past the TTL, twice over
            assert trainer.poll() is None
            assert states(c, ids) == dict.fromkeys(ids, "running")
            trainer.send_signal(signal.SIGKILL)
            trainer.wait(10)
            killed_at = time.monotonic()
            eventually_sync(lambda: states(c, ids) == {}, timeout=TTL + 5, interval=0.2)
            listed = time.monotonic() - killed_at

            def ended() -> bool:  # every kill done (SandboxKilled), not only asked for
                got = c.get(f"/leases/{lease}").json()
                return bool((got["state"], got["sandboxes"]) == ("expired", 0))

            eventually_sync(ended, timeout=60, interval=0.2)
            took = time.monotonic() - killed_at
        eventually_sync(lambda: not any(_alive(p) for p in pids.values()), timeout=30)
        gone = time.monotonic() - killed_at
        print(
            f"\n[rollouts] trainer killed holding {VMS} VMs (lease TTL {TTL:.0f} s): none "
            f"listed after {listed:.1f} s, every kill recorded after {took:.1f} s, every "
            f"QEMU gone after {gone:.1f} s"
        )
        assert took <= TTL + 5, f"the lease's sandboxes were all killed after {took:.1f} s"
    finally:
        if trainer.poll() is None:
            trainer.kill()


@pytest.mark.timeout(600)
def test_bulk_kill_by_metadata_ends_the_matching_vms_only(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in stack.env().items():
        monkeypatch.setenv(k, v)
    run = uuid.uuid4().hex[:8]
    doomed = [
        Sandbox.create(timeout=600, metadata={"run": run, "split": "train"}).sandbox_id
        for _ in range(VMS)
    ]
    kept = Sandbox.create(timeout=600, metadata={"run": run, "split": "eval"})
    pids = {sid: _qemu(stack, sid) for sid in doomed}
    with _client(stack) as c:
        t0 = time.monotonic()
        r = c.post("/sandboxes/bulk/kill", json={"metadata": {"run": run, "split": "train"}})
        took = time.monotonic() - t0
        assert r.status_code == 200, r.text
        assert (r.json()["count"], r.json()["matched"], r.json()["failed"]) == (VMS, VMS, [])
        assert states(c, doomed) == {}
        assert states(c, [kept.sandbox_id]) == {kept.sandbox_id: "running"}
    eventually_sync(lambda: not any(_alive(p) for p in pids.values()), timeout=30)
    assert kept.commands.run("echo alive").stdout.strip() == "alive"
    kept.kill()
    print(f"\n[rollouts] bulk kill of {VMS} VMs by metadata: one call, {took:.2f} s")


@pytest.mark.timeout(300)
def test_a_key_past_its_running_limit_is_refused_at_once(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in stack.env().items():
        monkeypatch.setenv(k, v)
    key_id, key = _limited_key(stack, "rollout-limited", max_sandboxes=2)
    with _client(stack, key) as c:
        made = [Sandbox.create(timeout=300, api_key=key) for _ in range(2)]
        t0 = time.monotonic()
        r = c.post("/sandboxes", json={"templateID": "base", "timeout": 60})
        took = time.monotonic() - t0
        assert r.status_code == 429, r.text
        assert r.json()["code"] == 429 and f"key {key_id}" in r.json()["message"], r.text
        assert int(r.headers["retry-after"]) >= 1
        assert took < 1.0, f"refused after {took:.2f} s"
        with pytest.raises(RateLimitException):
            Sandbox.create(timeout=60, api_key=key, retries=0)
        for sbx in made:  # the refusal touched nothing running
            assert sbx.commands.run("echo alive").stdout.strip() == "alive"
            sbx.kill()
    print(f"\n[rollouts] a key past its running limit of 2 VMs: 429 in {took * 1000:.0f} ms")


def _limited_key(stack: Stack, team: str, *, max_sandboxes: int) -> tuple[str, str]:
    """A new key of `team` limited to `max_sandboxes` running: (key id, key)."""
    data = ("--data-dir", str(stack.data_dir))
    made = subprocess.run(
        [*AENV, "keys", "create", "--team", team, *data],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    listed = subprocess.run(
        [*AENV, "keys", "ls", "--team", team, "-o", "json", *data],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    limited = subprocess.run(
        [*AENV, "keys", "limits", row["key_id"], "--max-sandboxes", str(max_sandboxes), *data],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert limited.returncode == 0, limited.stderr

    def applied() -> bool:
        again = subprocess.run(
            [*AENV, "keys", "ls", "--team", team, "-o", "json", *data],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return bool(json.loads(again.stdout)[0]["limits"] == {"max_sandboxes": max_sandboxes})

    eventually_sync(applied, timeout=30, interval=0.5)
    return str(row["key_id"]), key


def _client(stack: Stack, key: str | None = None) -> httpx.Client:
    headers = {"X-API-KEY": key or stack.api_key}
    return httpx.Client(base_url=stack.api_url, headers=headers, timeout=120)
