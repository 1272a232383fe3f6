"""Admission control on the real stack, nodes in memory (issue 32): a team past its running
limit or its creation rate is refused at once with 429, E2B's body and Retry-After — the
unchanged SDK raises its `RateLimitException` — while other teams go on; a key's own limit
(`aenv keys limits`) wins over its team's; a fleet with no room answers 503 with
Retry-After, also at once. Every refusal is counted by reason."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest
from e2b import RateLimitException, Sandbox, ServiceBusyException

from tests import series
from tests.support import eventually_sync
from tests.vmless.conftest import METRICS_TOKEN, VmlessStack, vmless_stack
from tests.vmless.keys import minted_key
from tests.vmless.nodes import beats

pytestmark = pytest.mark.usefixtures("sdk_env")

#: Room for 8 `base` sandboxes (1 vCPU / 512 MiB each); the default team may run 3; team
#: `rated` may start one every 2 s, 2 at once; team `fleet` has no running limit.
LIMITS = {"rated": {"creates_per_s": 0.5, "burst": 2}, "fleet": {"max_sandboxes": 0}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VmlessStack]:
    with vmless_stack(
        tmp_path_factory.mktemp("aenv-admission"),
        AENV_MEMORY_MIB="4096",
        AENV_VCPUS="8",
        AENV_MEMORY_OVERCOMMIT="1",
        AENV_CPU_OVERCOMMIT="1",
        AENV_TEAM_MAX_SANDBOXES="3",
        AENV_TEAM_LIMITS=json.dumps(LIMITS),
        AENV_PLACEMENT_TIMEOUT_S="2",  # a create past the heartbeats' word: withdrawn soon
    ) as s:
        yield s


@pytest.fixture(scope="module")
def sdk_env(stack: VmlessStack) -> Iterator[None]:
    """The SDK pointed at this module's stack (the package's `sdk_env` names another)."""
    with pytest.MonkeyPatch.context() as mp:
        for name in ("E2B_API_URL", "E2B_SANDBOX_URL"):
            mp.setenv(name, stack.api_url)
        mp.setenv("E2B_API_KEY", stack.api_key)
        yield


def _key(stack: VmlessStack, team: str) -> tuple[str, str]:
    return minted_key(stack, team, f"admission {team}")


def _client(stack: VmlessStack, key: str) -> httpx.Client:
    return httpx.Client(base_url=stack.api_url, headers={"X-API-KEY": key}, timeout=60)


def _create(c: httpx.Client) -> httpx.Response:
    return c.post("/v2/sandboxes", json={"templateID": "base", "timeout": 300})


def _made(c: httpx.Client) -> str:
    r = _create(c)
    assert r.status_code == 201, r.text
    return str(r.json()["sandboxID"])


def _timed(call: object) -> tuple[httpx.Response, float]:
    t0 = time.monotonic()
    r = call()  # type: ignore[operator]
    return r, time.monotonic() - t0


def _refused(r: httpx.Response, status: int, *words: str) -> int:
    """Assert `r` is an E2B refusal naming `words`; its Retry-After."""
    assert r.status_code == status, r.text
    body = r.json()
    assert body["code"] == status and isinstance(body["message"], str), body
    for word in words:
        assert word in body["message"], body
    retry = int(r.headers["retry-after"])
    assert 1 <= retry <= 30, retry
    return retry


def _kill_all(c: httpx.Client) -> None:
    for s in c.get("/v2/sandboxes", params={"state": "running,paused"}).json():
        c.delete(f"/sandboxes/{s['sandboxID']}")


def test_past_its_running_limit_a_team_is_refused_at_once_and_others_go_on(
    stack: VmlessStack,
) -> None:
    other_key = _key(stack, "other")[1]
    with _client(stack, stack.api_key) as c, _client(stack, other_key) as other:
        ids = [_made(c) for _ in range(3)]
        r, took = _timed(lambda: _create(c))
        _refused(r, 429, "3 sandboxes running", "may have 3", "AENV_TEAM_MAX_SANDBOXES")
        assert took < 1.0, f"refused after {took:.2f} s"

        t0 = time.monotonic()
        with pytest.raises(RateLimitException, match="AENV_TEAM_MAX_SANDBOXES"):
            Sandbox.create(timeout=60, retries=0)  # the unchanged SDK, its own exception
        assert time.monotonic() - t0 < 1.0

        assert _create(other).status_code == 201  # another team: its own count

        # a paused sandbox holds no VM: its slot is free, and its resume needs one
        assert c.post(f"/sandboxes/{ids[0]}/pause").status_code == 204
        fourth = eventually_sync(lambda: (r := _create(c)).status_code == 201 and r, timeout=10)
        assert fourth
        _refused(c.post(f"/sandboxes/{ids[0]}/connect", json={"timeout": 60}), 429, "kill")
        _refused(c.post(f"/sandboxes/{ids[0]}/resume", json={"timeout": 60}), 429)
        assert c.delete(f"/sandboxes/{fourth.json()['sandboxID']}").status_code == 204
        resumed = eventually_sync(
            lambda: (r := c.post(f"/sandboxes/{ids[0]}/connect", json={})).status_code == 201 and r,
            timeout=10,
        )
        assert resumed
        # a fork's children count too: two more of a team at 3 of 3
        fork = c.post(f"/sandboxes/{ids[1]}/fork", json={"count": 2})
        _refused(fork, 429, "2 more")
        _kill_all(c)
        _kill_all(other)


def test_past_its_creation_rate_a_team_waits_what_retry_after_says(stack: VmlessStack) -> None:
    rated = _key(stack, "rated")[1]
    with _client(stack, rated) as c, _client(stack, stack.api_key) as default:
        first = [_create(c) for _ in range(2)]  # the burst
        assert [r.status_code for r in first] == [201, 201], [r.text for r in first]
        r, took = _timed(lambda: _create(c))
        assert _refused(r, 429, "team rated", "0.5 sandboxes per second", "2 at once") in (1, 2)
        assert took < 1.0, f"refused after {took:.2f} s"
        assert _create(default).status_code == 201  # another team's bucket is full

        # the SDK honours Retry-After: a create of its own retries paces itself through
        t0 = time.monotonic()
        sbx = Sandbox.create(timeout=60, api_key=rated)
        waited = time.monotonic() - t0
        assert 0.5 < waited < 10, waited
        sbx.kill()
        _kill_all(c)
        _kill_all(default)


def test_a_keys_own_limit_wins_over_its_teams(stack: VmlessStack) -> None:
    key_id, key = _key(stack, "keyed")
    data = ("--data-dir", str(stack.data_dir))
    done = stack.aenv("keys", "limits", key_id, "--max-sandboxes", "1", *data)
    assert done.returncode == 0 and "max=1" in done.stderr, done
    listed = stack.aenv("keys", "ls", "--team", "keyed", "-o", "json", *data)
    assert json.loads(listed.stdout)[0]["limits"] == {"max_sandboxes": 1}, listed
    with _client(stack, key) as c:
        _made(c)
        _refused(_create(c), 429, f"key {key_id}", "may have 1")
        cleared = stack.aenv("keys", "limits", key_id, "--clear", *data)
        assert cleared.returncode == 0, cleared
        # the team's 3 again once the API's key cache (5 s) has let go of the override
        again = eventually_sync(lambda: _create(c).status_code == 201, timeout=10, interval=0.5)
        assert again
        _kill_all(c)


def test_a_fleet_with_no_room_answers_503_with_retry_after_at_once(stack: VmlessStack) -> None:
    eventually_sync(lambda: beats(stack)["vmless"].free_mem_mib == 4096, timeout=10)
    with _client(stack, _key(stack, "fleet")[1]) as c:
        made = 0
        while made < 10 and (r := _create(c)).status_code == 201:
            made += 1
        assert made == 8, (made, r.text)  # no running limit for this team: the room's

        def full() -> bool:
            b = beats(stack)["vmless"]
            return b.free_mem_mib == 0

        eventually_sync(full, timeout=10)
        r, took = _timed(lambda: _create(c))
        _refused(r, 503, "room")
        assert took < 1.0, f"refused after {took:.2f} s"
        t0 = time.monotonic()
        with pytest.raises(ServiceBusyException):
            Sandbox.create(timeout=60, retries=0, api_key=c.headers["x-api-key"])
        assert time.monotonic() - t0 < 1.0
        _kill_all(c)

    samples = series.scrape(stack.api_url, METRICS_TOKEN)
    refused = {
        dict(labels)["reason"]: value
        for (name, labels), value in samples.items()
        if name == "aenv_admission_refusals_total"
    }
    assert refused["running"] >= 5 and refused["rate"] >= 1 and refused["no_room"] >= 2, refused
