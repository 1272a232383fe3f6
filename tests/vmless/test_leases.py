"""Leases on the real stack, nodes in memory (issue 32): a trainer holding 20 sandboxes
under a lease and renewing it keeps them past the TTL; killed with SIGKILL, its sandboxes
are all killed within TTL + 5 s, with no call of ours; a lease opened with on_expiry=pause
pauses them instead; a create under an unknown, another team's or an ended lease is a
4xx with E2B's error body, and a TTL out of range a 400."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator

import httpx
import pytest
from e2b import Sandbox

from domain import lease as ls
from tests.series import scrape
from tests.support import eventually_sync
from tests.vmless.conftest import METRICS_TOKEN, VmlessStack, vmless_stack
from tests.vmless.keys import minted_key
from tests.vmless.lease_trainer import start

TTL = 3.0
#: room for the 50-sandbox bulk test beside the others (the in-memory host holds records)
ROOMY = {"AENV_CAPACITY": "200", "AENV_MEMORY_MIB": "262144", "AENV_VCPUS": "64"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VmlessStack]:
    with vmless_stack(tmp_path_factory.mktemp("aenv-leases"), **ROOMY) as s:
        yield s


@pytest.fixture
def sdk(stack: VmlessStack, monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("E2B_API_URL", "E2B_SANDBOX_URL"):
        monkeypatch.setenv(k, stack.api_url)
    monkeypatch.setenv("E2B_API_KEY", stack.api_key)


def tenant_key(stack: VmlessStack, team: str = "tenant") -> str:
    """A key of another team, once the API can see it."""
    return minted_key(stack, team, "another team")[1]


def states(c: httpx.Client, ids: list[str]) -> dict[str, str]:
    """The listed state of each of `ids` still listed (running or paused)."""
    r = c.get("/v2/sandboxes", params={"state": "running,paused", "limit": 100})
    assert r.status_code == 200, r.text
    listed = {s["sandboxID"]: s["state"] for s in r.json()}
    while r.headers.get("x-next-token"):
        r = c.get("/v2/sandboxes", params={"limit": 100, "nextToken": r.headers["x-next-token"]})
        listed |= {s["sandboxID"]: s["state"] for s in r.json()}
    return {s: listed[s] for s in ids if s in listed}


def expiries(stack: VmlessStack, on_expiry: str) -> float:
    """`aenv_lease_expiries_total` of the stack's one API for `on_expiry`."""
    key = ("aenv_lease_expiries_total", frozenset({("on_expiry", on_expiry)}))
    return scrape(stack.api_url, METRICS_TOKEN)[key]


def open_lease(c: httpx.Client, ttl: float, on_expiry: str = "kill") -> str:
    r = c.post("/leases", json={"ttl": ttl, "onExpiry": on_expiry})
    assert r.status_code == 201, r.text
    assert r.json()["state"] == "active" and r.json()["onExpiry"] == on_expiry
    return str(r.json()["leaseID"])


def test_a_crashed_trainers_sandboxes_are_killed_within_the_ttl(stack: VmlessStack) -> None:
    env = {"E2B_API_URL": stack.api_url, "E2B_SANDBOX_URL": stack.api_url}
    trainer, lease, ids = start(20, TTL, {**env, "E2B_API_KEY": stack.api_key})
    try:
        assert len(ids) == 20
        with stack.client() as c:
            time.sleep(2 * TTL)  # renewed every second: alive past the TTL, twice over
            assert trainer.poll() is None
            assert set(states(c, ids).values()) == {"running"} and len(states(c, ids)) == 20
            got = c.get(f"/leases/{lease}").json()
            assert (got["state"], got["sandboxes"]) == ("active", 20)

            trainer.send_signal(signal.SIGKILL)
            trainer.wait(10)
            killed_at = time.monotonic()
            eventually_sync(lambda: states(c, ids) == {}, timeout=TTL + 5, interval=0.2)
            took = time.monotonic() - killed_at
            assert took <= TTL + 5
            got = c.get(f"/leases/{lease}").json()
            assert (got["state"], got["sandboxes"]) == ("expired", 0)
            listed = stack.aenv("ls", "-o", "json")
            assert listed.returncode == 0, listed.stderr
            assert not set(ids) & {r["sandbox_id"] for r in json.loads(listed.stdout)}
            # an expired lease takes no more sandboxes, nor a renewal
            refused = c.post(
                "/v2/sandboxes", json={"templateID": "base", "metadata": {"aenv.lease": lease}}
            )
            assert refused.status_code == 409, refused.text
            assert refused.json()["code"] == 409 and "expired" in refused.json()["message"]
            assert c.post(f"/leases/{lease}/renew").status_code == 409
    finally:
        if trainer.poll() is None:
            trainer.kill()


def test_a_lease_with_on_expiry_pause_pauses_its_sandboxes(stack: VmlessStack, sdk: None) -> None:
    before = expiries(stack, "pause")
    with stack.client() as c:
        lease = open_lease(c, 2, "pause")
        ids = [
            Sandbox.create(timeout=600, metadata={"aenv.lease": lease}).sandbox_id for _ in range(3)
        ]
        other = Sandbox.create(timeout=600, metadata={"job": "no lease"}).sandbox_id
        eventually_sync(
            lambda: states(c, ids) == dict.fromkeys(ids, "paused"), timeout=2 + 5, interval=0.2
        )
        assert states(c, [other]) == {other: "running"}
        assert c.get(f"/leases/{lease}").json()["state"] == "expired"
        assert expiries(stack, "pause") == before + 1  # counted once, whatever the sweeps
        # ending it now kills what its expiry paused
        ended = c.delete(f"/leases/{lease}")
        assert ended.status_code == 200, ended.text
        assert sorted(ended.json()["sandboxIDs"]) == sorted(ids) and ended.json()["count"] == 3
        assert states(c, ids) == {}
        assert c.get(f"/leases/{lease}").json()["state"] == "ended"
        Sandbox.kill(other)


def test_delete_ends_a_lease_and_kills_its_sandboxes_at_once(stack: VmlessStack, sdk: None) -> None:
    with stack.client() as c:
        lease = open_lease(c, 60)
        ids = [
            Sandbox.create(timeout=600, metadata={"aenv.lease": lease}).sandbox_id for _ in range(2)
        ]
        ls = stack.aenv("lease", "ls")
        assert ls.returncode == 0 and lease in ls.stdout, ls
        rm = stack.aenv("lease", "rm", lease)
        assert rm.returncode == 0, rm.stderr
        assert rm.stdout == f"lease {lease} ended: killed 2 sandboxes\n"
        history = stack.aenv("events", lease, "-o", "json")
        assert history.returncode == 0, history.stderr
        types = [json.loads(line)["type"] for line in history.stdout.splitlines()]
        assert types == ["LeaseOpened", "LeaseEnded"], history.stdout
        assert states(c, ids) == {}


def test_creates_under_a_bad_lease_and_bad_ttls_are_refused(stack: VmlessStack) -> None:
    with (
        stack.client() as c,
        httpx.Client(
            base_url=stack.api_url, headers={"X-API-KEY": tenant_key(stack)}, timeout=30
        ) as tenant,
    ):
        theirs = open_lease(tenant, 60)
        for lease in ("lease-0000000000000000", theirs, "not a lease id!"):
            r = c.post(
                "/v2/sandboxes", json={"templateID": "base", "metadata": {"aenv.lease": lease}}
            )
            assert r.status_code == 400, r.text
            assert set(r.json()) == {"code", "message"} and "names no lease" in r.json()["message"]
            assert c.post(f"/leases/{lease}/renew").status_code == 404
            assert c.get(f"/leases/{lease}").status_code == 404
        for ttl in (0, -1, 86_401):
            r = c.post("/leases", json={"ttl": ttl})
            assert r.status_code == 400 and "out of range" in r.json()["message"], r.text
        r = c.post("/leases", json={"ttl": 10, "onExpiry": "explode"})
        assert r.status_code == 400, r.text
        mine = open_lease(c, 60)
        assert c.post(f"/leases/{mine}/renew", json={"ttl": 0}).status_code == 400
        renewed = c.post(f"/leases/{mine}/renew", json={"ttl": 120})
        assert renewed.status_code == 200 and renewed.json()["ttl"] == 120
        assert tenant.delete(f"/leases/{mine}").status_code == 404  # not theirs to end
        assert c.delete(f"/leases/{mine}").status_code == 200


def test_a_lease_expires_across_a_restart_of_the_api_that_times_it(
    stack: VmlessStack, sdk: None
) -> None:
    """The lease timer keeps nothing in memory: the API process (its only runner here)
    killed with SIGKILL right after the creates, its restart expires the lease and kills
    the sandboxes from the log and the read model."""
    with stack.client() as c:
        lease = open_lease(c, TTL)
        ids = [
            Sandbox.create(timeout=600, metadata={ls.LEASE_KEY: lease}).sandbox_id for _ in range(2)
        ]
    info = json.loads((stack.data_dir / "stack.json").read_text())
    api = int(info["roles"]["api"])
    os.kill(api, signal.SIGKILL)

    def restarted() -> bool:
        now = json.loads((stack.data_dir / "stack.json").read_text())
        return int(now["roles"]["api"]) != api

    eventually_sync(restarted, timeout=30, interval=0.2)
    with stack.client() as c:
        eventually_sync(lambda: states(c, ids) == {}, timeout=60, interval=0.5)
        assert c.get(f"/leases/{lease}").json()["state"] == "expired"
