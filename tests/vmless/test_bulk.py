"""Bulk kill, pause and list by metadata on the real stack, nodes in memory (issue 32):
one call kills the 50 sandboxes whose metadata matches and answers 50, leaving those with
another value and another team's with the same metadata running; an empty filter is a 400
unless `all: true`; a create racing a bulk kill is either in its answer and killed, or not
in it and running — never half; `aenv rm -m` is one bulk call."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from e2b import Sandbox

from tests.vmless.conftest import VmlessStack, vmless_stack
from tests.vmless.test_leases import ROOMY, states, tenant_key


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VmlessStack]:
    with vmless_stack(tmp_path_factory.mktemp("aenv-bulk"), **ROOMY) as s:
        yield s


def _create(
    stack: VmlessStack, metadata: dict[str, str], n: int, key: str | None = None
) -> list[str]:
    """`n` sandboxes with `metadata`, through the unchanged SDK, a few at a time."""
    opts = {"api_key": key or stack.api_key, "api_url": stack.api_url, "sandbox_url": stack.api_url}

    def one(_: int) -> str:
        return Sandbox.create(timeout=600, metadata=metadata, **opts).sandbox_id  # type: ignore[arg-type]

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, range(n)))


def test_bulk_kill_of_50_by_metadata_in_one_call(stack: VmlessStack) -> None:
    run = secrets.token_hex(3)
    doomed = _create(stack, {"run": run, "split": "train"}, 50)
    kept = _create(stack, {"run": run, "split": "eval"}, 3)
    tenant = tenant_key(stack)
    theirs = _create(stack, {"run": run, "split": "train"}, 2, key=tenant)
    with stack.client(timeout=120) as c:
        listed = c.post("/sandboxes/bulk/list", json={"metadata": {"run": run}})
        assert listed.status_code == 200 and listed.json()["count"] == 53, listed.text

        r = c.post("/sandboxes/bulk/kill", json={"metadata": {"run": run, "split": "train"}})
        assert r.status_code == 200, r.text
        assert (r.json()["count"], r.json()["matched"], r.json()["failed"]) == (50, 50, [])
        assert sorted(r.json()["sandboxIDs"]) == sorted(doomed)
        assert states(c, doomed) == {}  # gone when the call answers
        assert states(c, kept) == dict.fromkeys(kept, "running")
        again = c.post("/sandboxes/bulk/kill", json={"metadata": {"run": run, "split": "train"}})
        assert again.json()["count"] == 0

        paused = c.post("/sandboxes/bulk/pause", json={"metadata": {"run": run}})
        assert paused.status_code == 200 and paused.json()["count"] == 3, paused.text
        assert states(c, kept) == dict.fromkeys(kept, "paused")
    with httpx.Client(base_url=stack.api_url, headers={"X-API-KEY": tenant}, timeout=30) as t:
        assert states(t, theirs) == dict.fromkeys(theirs, "running")  # another team's: untouched
        gone = t.post("/sandboxes/bulk/kill", json={"all": True})
        assert gone.status_code == 200 and sorted(gone.json()["sandboxIDs"]) == sorted(theirs)
    with stack.client() as c:
        assert states(c, kept) == dict.fromkeys(kept, "paused")  # theirs `all` is theirs only
        rm = stack.aenv("rm", "-m", f"run={run}")
        assert (
            rm.returncode == 0
            and rm.stdout == f"killed 3 running and paused sandboxes with run={run}\n"
        ), rm
        assert states(c, kept) == {}


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"metadata": {}},
        {"all": False},
        {"all": True, "metadata": {"a": "b"}},
        {"metadata": {"a": 1}},
    ],
)
def test_an_empty_or_ambiguous_filter_is_refused(
    stack: VmlessStack, body: dict[str, object]
) -> None:
    with stack.client() as c:
        for action in ("kill", "pause", "list"):
            r = c.post(f"/sandboxes/bulk/{action}", json=body)
            assert r.status_code == 400, r.text
            assert set(r.json()) == {"code", "message"}


def test_a_create_racing_a_bulk_kill_is_in_its_answer_or_untouched(stack: VmlessStack) -> None:
    run = secrets.token_hex(3)
    first = _create(stack, {"run": run}, 5)
    racing: list[str] = []
    stop = threading.Event()

    def creates() -> None:
        while not stop.is_set() and len(racing) < 30:
            racing.extend(_create(stack, {"run": run}, 1))

    t = threading.Thread(target=creates)
    t.start()
    try:
        with stack.client(timeout=120) as c:
            while len(racing) < 3:
                stop.wait(0.05)
            r = c.post("/sandboxes/bulk/kill", json={"metadata": {"run": run}})
    finally:
        stop.set()
        t.join(60)
    assert r.status_code == 200, r.text
    killed = set(r.json()["sandboxIDs"])
    assert set(first) <= killed and r.json()["failed"] == []
    with stack.client() as c:
        now = states(c, [*first, *racing])
        for sid in [*first, *racing]:
            assert (sid in killed) == (sid not in now), sid  # killed whole, or running
        assert set(now.values()) <= {"running"}
        c.post("/sandboxes/bulk/kill", json={"metadata": {"run": run}})
