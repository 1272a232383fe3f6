"""Long commands survive their stream (issue 32), on a real VM through the whole path
(SDK -> API proxy -> node proxy -> envd) with the unchanged e2b SDK: a foreground
`commands.run` whose client is killed mid-command finishes in the guest, and a fresh
client's `commands.connect(pid)` gets the rest of its output and its exit code; a process
that ended while nobody was attached still gives its exit code and its output's tail; a
run whose stream the API's restart cuts goes on as well.

CI form: a 12 s command cut at 3 s; `make test-scale` runs the issue's 60 s cut at 10 s
(`AENV_LONG_COMMAND_S=60 AENV_LONG_COMMAND_CUT_S=10`).
"""

from __future__ import annotations

import json
import os
import signal
import threading

import httpx
import pytest
from e2b import CommandExitException, Sandbox

from envd.tails import TAIL_BYTES
from tests.cutclient import run_and_cut
from tests.e2e.conftest import Stack
from tests.support import eventually_sync

pytestmark = pytest.mark.vm

DURATION_S = int(os.environ.get("AENV_LONG_COMMAND_S", "12"))
CUT_AT_S = int(os.environ.get("AENV_LONG_COMMAND_CUT_S", "3"))


def _pids(sbx: Sandbox) -> set[int]:
    return {p.pid for p in sbx.commands.list()}


@pytest.mark.timeout(DURATION_S + 240)
def test_a_cut_command_finishes_and_a_fresh_client_gets_the_rest(stack: Stack) -> None:
    sbx = Sandbox.create(timeout=DURATION_S + 180)
    try:
        cmd = (
            f"for i in $(seq 1 {DURATION_S}); do echo tick $i; sleep 1; done;"
            " echo finished >&2; exit 5"
        )
        args = ["sandbox", sbx.sandbox_id, str(DURATION_S + 120), cmd]
        seen = run_and_cut(args, until=f"tick {CUT_AT_S}")  # SIGKILL: its connection drops
        running = [p.pid for p in sbx.commands.list() if p.args[-1:] == [cmd]]
        assert len(running) == 1, "the command did not survive its client"
        fresh = Sandbox.connect(sbx.sandbox_id)
        with pytest.raises(CommandExitException) as info:
            fresh.commands.connect(running[0]).wait()
        assert info.value.exit_code == 5
        assert info.value.stderr == "finished\n"
        rest = (info.value.stdout or "").splitlines()
        assert rest[-1] == f"tick {DURATION_S}"
        # what the guest printed between the cut and the connect came first: nothing lost
        assert seen[1:] + rest == [f"tick {i}" for i in range(1, DURATION_S + 1)]
    finally:
        sbx.kill()


def test_a_process_that_ended_unattached_keeps_its_exit_and_tail(stack: Stack) -> None:
    sbx = Sandbox.create(timeout=300)
    try:
        h = sbx.commands.run(
            "sleep 1; seq 1 100000; echo bye >&2; exit 7", background=True, timeout=0
        )
        h.disconnect()
        eventually_sync(lambda: h.pid not in _pids(sbx), timeout=30, interval=0.5)
        fresh = Sandbox.connect(sbx.sandbox_id)
        with pytest.raises(CommandExitException) as info:
            fresh.commands.connect(h.pid).wait()
        assert info.value.exit_code == 7
        assert info.value.stderr == "bye\n"
        out = info.value.stdout or ""
        assert len(out) == TAIL_BYTES and out.endswith("\n99999\n100000\n")
    finally:
        sbx.kill()


def _api_pid(stack: Stack) -> int:
    return int(json.loads((stack.data_dir / "stack.json").read_text())["roles"]["api"])


def _api_up(stack: Stack) -> bool:
    return httpx.get(f"{stack.api_url}/health", timeout=2).status_code < 500


@pytest.mark.timeout(300)
def test_a_run_cut_by_the_api_restarting_goes_on(stack: Stack) -> None:
    """The API proxies the stream: SIGKILLed mid-command (its supervisor restarts it), the
    command goes on in the guest and is there to connect to once the API is back."""
    sbx = Sandbox.create(timeout=300)
    try:
        ticks = [f"tick {i}" for i in range(1, 16)]
        cmd = "for i in $(seq 1 15); do echo tick $i; sleep 1; done; exit 3"
        seen: list[str] = []
        third = threading.Event()
        failed: list[BaseException] = []

        def out(s: str) -> None:
            seen.extend(s.splitlines())
            if "tick 3" in seen:
                third.set()

        def run() -> None:
            try:
                sbx.commands.run(cmd, timeout=120, on_stdout=out)
            except BaseException as e:  # the cut, whatever the SDK makes of it
                failed.append(e)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        assert third.wait(60)
        (pid,) = [p.pid for p in sbx.commands.list() if p.args[-1:] == [cmd]]
        api = _api_pid(stack)
        os.kill(api, signal.SIGKILL)
        t.join(30)
        assert failed, "the stream should have been cut with the API"
        eventually_sync(lambda: _api_pid(stack) != api and _api_up(stack), timeout=60)
        fresh = Sandbox.connect(sbx.sandbox_id)
        # running still, or (an API slower to come back than the command) ended and kept
        with pytest.raises(CommandExitException) as info:
            fresh.commands.connect(pid).wait()
        assert info.value.exit_code == 3
        rest = (info.value.stdout or "").splitlines()
        # the rest, from where the cut stream stopped (or earlier: kept and replayed)
        assert rest == ticks[len(ticks) - len(rest) :]
        assert len(seen) + len(rest) >= len(ticks), (seen, rest)
    finally:
        sbx.kill()
