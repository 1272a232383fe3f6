"""Placement by disk on the real stack (node hosts in memory; images-at-scale S9, issue
42). Three nodes, all with room for a create by their heartbeats but for one disk:
`vmless-full`'s budget leaves no room (`AENV_DISK_BUDGET_BYTES`), so it pulls no create;
`vmless-nodisk` finds out only when it fetches the template — its in-memory host refuses
the fetch of `base` and `big` as a full budget would (`AENV_MEMORY_HOST_NO_ROOM_FOR`:
`NoRoom`), and the stack's own `vmless` refuses `big`'s. Every create lands on `vmless`;
a template whose recorded sizes fit on none, whose fetch every node refuses, or whose
bytes are nowhere is a 503 with E2B's `{code, message}` body saying why, within seconds —
never a 500, never a wait until the create's timeout."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from bus.nodes import Heartbeat
from tests.support import eventually_sync
from tests.vmless.conftest import VmlessStack, vmless_stack
from tests.vmless.nodes import beats, more_nodes, sized_template

GIB = 1 << 30
#: node `vmless` (the stack's own) may keep 64 GiB; `vmless-full` 1 MiB, under the 1 GiB
#: headroom every create keeps
ROOMY, FULL = 64 * GIB, 1 << 20
NODES = ("vmless", "vmless-full", "vmless-nodisk")


#: a 503 comes once every delivery of the create is refused (at once, no delay between
#: them): well within the API's placement timeout (10 s) and the create's (120 s)
BOUND_S = 5.0


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VmlessStack]:
    root = tmp_path_factory.mktemp("aenv-disk-placement")
    env = {"AENV_DISK_BUDGET_BYTES": str(ROOMY), "AENV_MEMORY_HOST_NO_ROOM_FOR": "big"}
    others = {
        # its disk budget all but spent
        "vmless-full": {"AENV_DISK_BUDGET_BYTES": str(FULL)},
        # its budget has room, but its fetches of `base` and `big` are refused
        "vmless-nodisk": {
            "AENV_DISK_BUDGET_BYTES": str(ROOMY // 2),
            "AENV_MEMORY_HOST_NO_ROOM_FOR": "base,big",
        },
    }
    with vmless_stack(root / "stack", **env) as stack, more_nodes(stack, root, others):
        # every node has beaten with its disk walked (before: room unknown, no refusal)
        def walked() -> bool:
            found = beats(stack)
            return all(n in found and found[n].disk_room is not None for n in NODES)

        eventually_sync(walked, timeout=30, interval=0.3)
        yield stack


def test_a_node_without_disk_room_gets_no_create_and_none_with_room_is_a_503(
    two: VmlessStack,
) -> None:
    # both beat, with the room memory-wise; only their disks differ
    def both() -> dict[str, Heartbeat] | None:
        found = beats(two)
        full, roomy = found.get("vmless-full"), found.get("vmless")
        ok = full is not None and roomy is not None and full.disk_room is not None
        return found if ok and roomy.disk_room is not None else None

    both_beats = eventually_sync(both, timeout=30, interval=0.3)
    assert both_beats is not None
    full, roomy = both_beats["vmless-full"], both_beats["vmless"]
    assert (full.disk_budget, roomy.disk_budget) == (FULL, ROOMY)
    assert full.disk_room is not None and full.disk_room < GIB, full
    assert roomy.disk_room is not None and roomy.disk_room > GIB, roomy
    assert full.free > 0 and "base" in full.templates  # it would take `base` but for its disk
    # `aenv status` shows each node's disk
    status = two.aenv("status")
    assert f'"budget": {FULL}' in status.stdout and f'"budget": {ROOMY}' in status.stdout

    with two.client(timeout=60) as c:
        made: list[str] = []
        try:
            for _ in range(8):
                r = c.post("/v2/sandboxes", json={"templateID": "base", "timeout": 120})
                assert r.status_code == 201, r.text
                made.append(r.json()["sandboxID"])
            nodes = {c.get(f"/sandboxes/{sid}").json()["nodeID"] for sid in made}
            assert nodes == {"vmless"}, nodes
        finally:
            for sid in made:
                c.delete(f"/sandboxes/{sid}")

        # a template whose recorded image is larger than either node's room: refused at
        # once, the disk named (E2B's {code, message} body)
        sized_template(two, "huge", image_bytes=128 * GIB)

        def refused() -> httpx.Response | None:
            # until the projection has its size, a create goes to a node, which refuses a
            # template it never had (503 too, naming the missing bytes): wait past that
            r = c.post("/v2/sandboxes", json={"templateID": "huge", "timeout": 120})
            return r if r.status_code == 503 and "disk room" in r.text else None

        r = eventually_sync(refused, timeout=15, interval=0.3)
        assert r is not None
        body = r.json()
        assert body["code"] == 503, body
        message = body["message"]
        assert "no node has disk room for template huge" in message, message
        assert f"needs {128 * GIB + (200 << 20) + GIB} bytes" in message, message
        assert "on vmless" in message, message
        assert r.headers["retry-after"] == "5"


def _refused(c: httpx.Client, template: str) -> str:
    """A create of `template` answered 503 within `BOUND_S`: its message."""
    t0 = time.monotonic()
    r = c.post("/v2/sandboxes", json={"templateID": template, "timeout": 120})
    elapsed = time.monotonic() - t0
    assert r.status_code == 503, r.text
    assert elapsed < BOUND_S, f"answered after {elapsed:.1f} s: {r.text}"
    body = r.json()
    assert body["code"] == 503 and isinstance(body["message"], str), body
    return str(body["message"])


def test_a_template_whose_fetch_every_node_refuses_is_a_503_naming_the_disk(
    two: VmlessStack,
) -> None:
    sized_template(two, "big", image_bytes=100 << 20)  # fits every room by the heartbeats
    with two.client(timeout=60) as c:
        message = _refused(c, "big")
    assert "cannot take template big" in message, message
    assert "node disk budget: need 2048 MiB" in message, message


def test_a_template_whose_bytes_are_nowhere_is_a_503_not_a_500(two: VmlessStack) -> None:
    # registered (a build's record), but captured nowhere this fleet can fetch it from
    sized_template(two, "nowhere", image_bytes=100 << 20)
    with two.client(timeout=60) as c:
        message = _refused(c, "nowhere")
    assert "cannot take template nowhere" in message, message
    assert "is not on this node and its capture is not in the snapshot" in message, message
