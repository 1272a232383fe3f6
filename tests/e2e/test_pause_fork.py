"""Fork of a *paused* sandbox into N children (issue 32): E2B's `POST /sandboxes/{id}/fork`
with a count, on a sandbox paused with a file written and a process running. Each child
restores the pause's durable capture (the node fetches it from the repository once, into
a directory apart from the parent's own capture, and maps it copy-on-write) and has the
file and the process with its memory; the children diverge alone; the parent stays
paused and its resume gives its own state. Before the capture is durable the fork is a
409; a bad count 400; an unknown sandbox 404 — E2B's `{code, message}` each."""

from __future__ import annotations

import time

import httpx
import pytest
from e2b import Sandbox, SandboxState

from tests.e2e.conftest import Stack
from tests.e2e.warmpool import node_warm
from tests.support import eventually_sync

pytestmark = pytest.mark.vm

CHILDREN = 3

# A process whose memory we can read from outside: a secret drawn once, held in RAM only,
# and a count it keeps raising; it writes both to a file (write-then-rename: never empty).
KEEPER = (
    "python3 -c 'import os, time\n"
    "secret = os.urandom(8).hex()\n"
    "n = 0\n"
    "while True:\n"
    "    n += 1\n"
    '    open("/tmp/state.new", "w").write(f"{secret} {n}")\n'
    '    os.replace("/tmp/state.new", "/tmp/state")\n'
    "    time.sleep(0.05)\n' >/dev/null 2>&1 &"
)


def _state(sbx: Sandbox) -> tuple[str, int]:
    secret, n = sbx.files.read("/tmp/state").split()
    return secret, int(n)


def _fork(c: httpx.Client, sandbox_id: str, **body: int) -> httpx.Response:
    return c.post(f"/sandboxes/{sandbox_id}/fork", json=body)


def test_a_paused_sandbox_forks_into_children_and_stays_paused(stack: Stack) -> None:
    src = Sandbox.create(timeout=600)
    kids: list[str] = []
    headers = {"X-API-KEY": stack.api_key}
    with httpx.Client(base_url=stack.api_url, timeout=300, headers=headers) as c:
        try:
            src.files.write("/home/user/prepared.txt", "prepared before the pause")
            src.commands.run(KEEPER)
            eventually_sync(lambda: _state(src)[1] > 3, timeout=30)
            secret, before = _state(src)
            assert src.pause() is True

            # its capture uploads ~2 s after the pause: until then a clear 409
            first = _fork(c, src.sandbox_id, count=1)
            print(f"pause fork right after the pause: {first.status_code} {first.text[:160]}")
            if first.status_code == 409:
                assert first.json()["code"] == 409, first.text
                assert "being paused" in first.json()["message"], first.text
                assert first.headers.get("retry-after"), first.headers
            else:  # durable already (a slow host): that child is one more to check
                assert first.status_code == 201, first.text
                kids += [x["sandbox"]["sandboxID"] for x in first.json()]
            for bad in (0, 101):
                r = _fork(c, src.sandbox_id, count=bad)
                assert r.status_code == 400 and r.json()["code"] == 400, r.text
            r = _fork(c, "nosuchsandbox0", count=2)
            assert r.status_code == 404 and r.json()["code"] == 404, r.text

            t0 = time.monotonic()

            def forked() -> list[Sandbox | Exception] | None:
                """The fork through the unchanged SDK, once the capture is durable."""
                try:
                    return Sandbox.fork(src.sandbox_id, count=CHILDREN, timeout=300)
                except Exception as e:
                    if "being paused" in str(e):
                        return None
                    raise

            results = eventually_sync(forked, timeout=120, interval=1)
            took = time.monotonic() - t0
            assert len(results) == CHILDREN
            new = [x.sandbox_id for x in results if isinstance(x, Sandbox)]
            assert len(new) == CHILDREN, results
            kids += new
            print(f"pause fork: {CHILDREN} children in {took:.1f} s (upload wait included)")

            # the template the capture is lent to is the fork's: no create starts it by name
            lent = Sandbox.get_info(kids[-1]).template_id
            assert lent.startswith("paused-"), lent
            r = c.post("/sandboxes", json={"templateID": lent})
            assert r.status_code == 404 and r.json()["code"] == 404, r.text

            # the parent: untouched, still paused
            assert Sandbox.get_info(src.sandbox_id).state == SandboxState.PAUSED

            for i, kid in enumerate(kids):
                detail = c.get(f"/sandboxes/{kid}").json()
                assert detail["forkedFrom"] == src.sandbox_id, detail  # lineage
                assert detail["metadata"].get("aenv.fork"), detail
                child = Sandbox.connect(kid, timeout=300)
                assert child.files.read("/home/user/prepared.txt") == "prepared before the pause"
                got, n = _state(child)
                assert got == secret and n >= before, (got, n, secret, before)  # its memory
                eventually_sync(lambda ch=child, n=n: _state(ch)[1] > n, timeout=30)  # it runs
                child.files.write("/home/user/mine.txt", f"child-{i}")
            for i, kid in enumerate(kids):  # each diverged alone
                child = Sandbox.connect(kid, timeout=300)
                assert child.files.read("/home/user/mine.txt") == f"child-{i}"

            assert Sandbox.get_info(src.sandbox_id).state == SandboxState.PAUSED
            # the lent template is never warmed: its children were all made at once and
            # no create ever starts it again (the pool warmed 3 VMs of it before)
            seen: list[dict[str, int]] = []
            for _ in range(8):
                time.sleep(1)
                seen.append(node_warm(stack))
            assert not [w for w in seen if w.get(lent)], seen
            back = Sandbox.connect(src.sandbox_id, timeout=600)  # resume: its own state
            assert back.files.read("/home/user/prepared.txt") == "prepared before the pause"
            assert not back.files.exists("/home/user/mine.txt")
            got, n = _state(back)
            assert got == secret and n >= before
            eventually_sync(lambda: _state(back)[1] > n, timeout=30)
        finally:
            for k in kids:
                Sandbox.kill(k)
            Sandbox.kill(src.sandbox_id)
