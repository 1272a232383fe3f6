"""Commands outlive their stream (issue 32): a `commands.run` whose client is cut goes on,
a fresh client's `commands.connect(pid)` gets the rest of its output and its exit code, and
a process that ended while nobody was attached still answers with its output's tail and
exit code for a while. envd on the host, the unchanged e2b SDK (the VM form is
tests/e2e/test_long_commands.py)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from collections.abc import Iterator

import httpx
import pytest
from e2b import CommandExitException, NotFoundException, Sandbox
from e2b.sandbox.commands.command_handle import PtySize

from envd.procs import ProcessTable, SpawnSpec, Subscriber
from envd.tails import TAIL_BYTES
from envd.users import current
from tests.cutclient import run_and_cut
from tests.integration.envd.conftest import (
    Envd,
    init_envd,
    make_sandbox,
    start_envd,
    stop_envd,
)
from tests.support import eventually, eventually_sync

pytestmark = pytest.mark.timeout(60)

TICKS = 12
#: prints a numbered line every 0.25 s, one on stderr at the end, exits 3
TICKING = f"for i in $(seq 1 {TICKS}); do echo line $i; sleep 0.25; done; echo err-tail >&2; exit 3"


def _running(sbx: Sandbox, cmd: str) -> int | None:
    for p in sbx.commands.list():
        if p.args[-1:] == [cmd]:
            return p.pid
    return None


def test_a_cut_run_goes_on_and_a_fresh_client_gets_the_rest(envd: Envd, sandbox: Sandbox) -> None:
    assert envd.token is not None
    seen = run_and_cut(["envd", envd.url, envd.token, "60", TICKING], until="line 2")
    pid = _running(sandbox, TICKING)
    assert pid is not None  # the client is gone, the process is not
    time.sleep(0.8)  # a few lines are printed while nobody is attached
    fresh = make_sandbox(envd, envd.token)
    with pytest.raises(CommandExitException) as info:
        fresh.commands.connect(pid).wait()
    assert info.value.exit_code == 3
    assert info.value.stderr == "err-tail\n"
    rest = (info.value.stdout or "").splitlines()
    assert rest[-1] == f"line {TICKS}"
    # what was printed while nobody was attached came first: nothing is missing
    assert seen[1:] + rest == [f"line {i}" for i in range(1, TICKS + 1)]


def test_a_process_that_ended_unattached_keeps_its_exit_and_output(sandbox: Sandbox) -> None:
    h = sandbox.commands.run(
        "echo a; echo b >&2; sleep 0.3; echo c; exit 4", background=True, timeout=0
    )
    h.disconnect()
    eventually_sync(lambda: h.pid not in {p.pid for p in sandbox.commands.list()})
    for _ in range(2):  # any number of clients, any number of times
        with pytest.raises(CommandExitException) as info:
            sandbox.commands.connect(h.pid).wait()
        assert info.value.exit_code == 4
        assert (info.value.stdout, info.value.stderr) == ("a\nc\n", "b\n")
    # ended: not listed, nothing to signal (E2B's answers for a gone process)
    assert sandbox.commands.kill(h.pid) is False


def test_output_nobody_reads_never_blocks_and_its_tail_is_kept(sandbox: Sandbox) -> None:
    """50 MB written with no stream attached: envd reads on (the process never blocks on
    a full pipe) and keeps the last 64 KiB."""
    h = sandbox.commands.run(
        "head -c 50000000 /dev/zero | tr '\\0' x; echo; echo END", background=True, timeout=0
    )
    h.disconnect()
    eventually_sync(lambda: h.pid not in {p.pid for p in sandbox.commands.list()}, timeout=30)
    r = sandbox.commands.connect(h.pid).wait()
    assert r.exit_code == 0
    assert r.stdout.endswith("xxxx\nEND\n") and len(r.stdout) == TAIL_BYTES


def test_a_terminal_outlives_its_stream_without_a_hangup(sandbox: Sandbox) -> None:
    """The pty's master stays with envd: a cut stream sends the shell no SIGHUP; what it
    printed after the cut and its exit come back by `pty.connect(pid)`."""
    h = sandbox.pty.create(PtySize(rows=24, cols=80), timeout=0)
    sandbox.pty.send_stdin(
        h.pid,
        b"trap 'echo HUP >/dev/null; exit 99' HUP; echo on-$((40+2)); sleep 1;"
        b" echo after-$((1+1)); exit 6\n",
    )
    seen = bytearray()
    for _, _, pty in h:
        seen += pty or b""
        if b"on-42" in seen:
            break
    h.disconnect()
    eventually_sync(lambda: h.pid not in {p.pid for p in sandbox.commands.list()}, timeout=10)
    replayed = bytearray()
    with pytest.raises(CommandExitException) as info:
        sandbox.pty.connect(h.pid).wait(on_pty=replayed.extend)
    assert info.value.exit_code == 6
    assert b"after-2" in replayed


@pytest.fixture(params=["flag", "init"])
def forgetful(request: pytest.FixtureRequest) -> Iterator[Envd]:
    """An envd that keeps ended processes 1 s: by its flag, or told by the node's /init."""
    if request.param == "flag":
        e = start_envd("--ended-keep-s", "1")
        init_envd(e, "tok-forgetful")
    else:
        e = start_envd()
        r = httpx.post(f"{e.url}/init", json={"accessToken": "t", "aenvEndedKeepS": "x"})
        assert r.status_code == 400 and "aenvEndedKeepS" in r.text
        init_envd(e, "tok-forgetful", aenvEndedKeep=5, aenvEndedKeepS=1)
    yield e
    stop_envd(e)


def test_an_ended_process_is_forgotten_after_its_keep_time(forgetful: Envd) -> None:
    sbx = make_sandbox(forgetful, forgetful.token)
    pid = sbx.commands.run("echo gone", background=True, timeout=0).pid
    eventually_sync(lambda: pid not in {p.pid for p in sbx.commands.list()})
    assert sbx.commands.connect(pid).wait().stdout == "gone\n"

    def forgotten() -> bool:
        try:
            sbx.commands.connect(pid)
        except NotFoundException:
            return True
        return False

    eventually_sync(forgotten, timeout=5)


def _take(sub: Subscriber) -> tuple[str, int]:
    """What the queued data events of a stream hold, decoded, and the number of the first
    chunk among them (as a stream takes them to send them)."""
    out, first = b"", -1
    while not sub.queue.empty():
        _, payload, seq = sub.queue.get_nowait()
        first = seq if first < 0 else first
        out += base64.b64decode(json.loads(payload)["event"]["data"]["stdout"])
    return out.decode(), first


async def test_what_a_cut_stream_had_not_sent_goes_to_the_next_one() -> None:
    """A stream cut with output queued, or halfway through sending it: the next stream
    attached gets it first (the process table itself, no HTTP: the cut is staged)."""
    table = ProcessTable(asyncio.get_running_loop())
    spec = SpawnSpec(
        argv=["/bin/sh", "-c", "echo one; sleep 0.1; echo two; sleep 0.1; echo three; sleep 30"],
        env=dict(os.environ),
        cwd="/",
        user=current(),
        stdin=False,
        pty_size=None,
        timeout_s=None,
        config_json={},
        tag=None,
    )
    first = Subscriber()
    proc = table.spawn(spec, first=first)
    try:

        async def all_read() -> bool:
            return first.queue.qsize() == 3

        await eventually(all_read)
        first.queue.get_nowait()  # "one" sent ...
        proc.unsubscribe(first)  # ... then cut with "two" and "three" still queued
        second = proc.subscribe()
        text, seq = _take(second)
        assert text == "two\nthree\n"
        second.sending = seq  # cut while sending them: they are not lost either
        proc.unsubscribe(second)
        third = proc.subscribe()
        assert _take(third)[0] == "two\nthree\n"
        proc.unsubscribe(third)  # all sent, then cut: nothing for the next one
        assert _take(proc.subscribe())[0] == ""
    finally:
        proc.signal(9)

        async def ended() -> bool:
            return proc.finished

        await eventually(ended)
