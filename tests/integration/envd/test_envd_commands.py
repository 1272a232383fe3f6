"""process.Process through `sandbox.commands`: what unchanged E2B code relies on."""

from __future__ import annotations

import threading
import time
from typing import Any, cast

import pytest
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b import AsyncSandbox, CommandExitException, Sandbox, TimeoutException
from e2b.envd.process import process_pb
from protobuf import Oneof

from tests.integration.envd.conftest import Envd
from tests.support import eventually, eventually_sync

pytestmark = pytest.mark.timeout(30)


def test_run_stdout_stderr_and_sandbox_env(sandbox: Sandbox, test_user: str) -> None:
    r = sandbox.commands.run("echo hi; echo err >&2; echo $SANDBOX_VAR; whoami")
    assert r.stdout == f"hi\nfrom-init\n{test_user}\n"
    assert r.stderr == "err\n"
    assert r.exit_code == 0
    assert r.error is None


def test_exit_code_raises_command_exit(sandbox: Sandbox) -> None:
    with pytest.raises(CommandExitException) as info:
        sandbox.commands.run("echo out; echo bad >&2; exit 3")
    assert info.value.exit_code == 3
    assert info.value.error == "exit status 3"
    assert info.value.stdout == "out\n"
    assert info.value.stderr == "bad\n"


def test_envs_and_cwd(sandbox: Sandbox, workdir: str) -> None:
    r = sandbox.commands.run("pwd; echo $X; echo $HOME", envs={"X": "y"}, cwd=workdir)
    lines = r.stdout.splitlines()
    assert lines[0] == workdir
    assert lines[1] == "y"


def test_default_cwd_is_home(sandbox: Sandbox, home: str) -> None:
    assert sandbox.commands.run("pwd").stdout.strip() == home


def test_missing_cwd_is_invalid_argument(sandbox: Sandbox) -> None:
    from e2b import InvalidArgumentException

    with pytest.raises(InvalidArgumentException):
        sandbox.commands.run("true", cwd="/definitely/not/here")


def test_run_as_other_user(sandbox: Sandbox) -> None:
    assert sandbox.commands.run("whoami", user="root").stdout == "root\n"


def test_unknown_user_is_refused(sandbox: Sandbox) -> None:
    from e2b import AuthenticationException

    with pytest.raises(AuthenticationException, match="invalid username"):
        sandbox.commands.run("true", user="no-such-user-xyz")


def test_thousand_lines_arrive_in_order(sandbox: Sandbox) -> None:
    chunks: list[str] = []
    r = sandbox.commands.run(
        "for i in $(seq 1 1000); do echo line-$i; done", on_stdout=chunks.append
    )
    expected = "".join(f"line-{i}\n" for i in range(1, 1001))
    assert r.stdout == expected
    assert "".join(chunks) == expected


def test_background_list_connect_kill(sandbox: Sandbox) -> None:
    h = sandbox.commands.run("sleep 30", background=True)
    procs = {p.pid: p for p in sandbox.commands.list()}
    assert h.pid in procs
    assert procs[h.pid].cmd == "/bin/bash"
    assert procs[h.pid].args == ["-l", "-c", "sleep 30"]
    other = sandbox.commands.connect(h.pid)
    assert sandbox.commands.kill(h.pid) is True
    with pytest.raises(CommandExitException) as info:
        other.wait()
    assert info.value.exit_code == -1
    assert info.value.error == "signal: killed"
    with pytest.raises(CommandExitException):
        h.wait()
    eventually_sync(lambda: h.pid not in {p.pid for p in sandbox.commands.list()})
    assert sandbox.commands.kill(h.pid) is False


def test_kill_unknown_pid_returns_false(sandbox: Sandbox) -> None:
    assert sandbox.commands.kill(999_999) is False


def test_connect_unknown_pid_not_found(sandbox: Sandbox) -> None:
    from e2b import NotFoundException

    with pytest.raises(NotFoundException):
        sandbox.commands.connect(999_999)


def test_send_stdin(sandbox: Sandbox) -> None:
    h = sandbox.commands.run("read x; echo got:$x", background=True, stdin=True)
    sandbox.commands.send_stdin(h.pid, "abc\n")
    assert h.wait().stdout == "got:abc\n"


def test_close_stdin_gives_eof(sandbox: Sandbox) -> None:
    h = sandbox.commands.run("cat; echo done", background=True, stdin=True)
    h.send_stdin("a\n")
    h.close_stdin()
    assert h.wait().stdout == "a\ndone\n"


def test_stdin_false_reads_dev_null(sandbox: Sandbox) -> None:
    assert sandbox.commands.run("cat; echo eof").stdout == "eof\n"


def test_send_stdin_without_stdin_is_refused(sandbox: Sandbox) -> None:
    from e2b import SandboxException

    h = sandbox.commands.run("sleep 5", background=True)
    try:
        with pytest.raises(SandboxException):
            sandbox.commands.send_stdin(h.pid, "x")
    finally:
        h.kill()


def test_stream_input_sync(sandbox: Sandbox) -> None:
    h = sandbox.commands.run("cat", background=True, stdin=True)
    sandbox.commands.stream_input(h.pid, [b"one\n", "two\n"])
    sandbox.commands.close_stdin(h.pid)
    assert h.wait().stdout == "one\ntwo\n"


async def test_stream_input_async(async_sandbox: AsyncSandbox) -> None:
    h = await async_sandbox.commands.run("cat", background=True, stdin=True)
    handle = async_sandbox.commands.stream_input(h.pid)
    await handle.send("a\n")
    await handle.send(b"b\n")
    await handle.close()
    await async_sandbox.commands.close_stdin(h.pid)
    r = await h.wait()
    assert r.stdout == "a\nb\n"


async def test_async_run_and_kill(async_sandbox: AsyncSandbox) -> None:
    r = await async_sandbox.commands.run("echo async-ok")
    assert r.stdout == "async-ok\n"
    h = await async_sandbox.commands.run("sleep 30", background=True)
    assert await async_sandbox.commands.kill(h.pid) is True
    with pytest.raises(CommandExitException):
        await h.wait()

    async def gone() -> bool:
        return h.pid not in {p.pid for p in await async_sandbox.commands.list()}

    await eventually(gone)


def test_timeout_kills_the_process(sandbox: Sandbox) -> None:
    start = time.monotonic()
    with pytest.raises(TimeoutException):
        sandbox.commands.run("echo started; sleep 30", timeout=1)
    assert time.monotonic() - start < 5
    # envd uses Connect-Timeout-Ms as the process lifetime: nothing is left running.
    eventually_sync(
        lambda: not any(p.args[-1:] == ["echo started; sleep 30"] for p in sandbox.commands.list())
    )


def test_reconnect_after_dropped_stream_gets_only_new_output(sandbox: Sandbox) -> None:
    h = sandbox.commands.run("echo first; read x; echo second:$x", background=True, stdin=True)
    seen: list[str] = []
    for out, _, _ in h:
        if out:
            seen.append(out)
            break
    assert seen == ["first\n"]
    h.disconnect()
    # The process survives its stream and can be re-attached by pid.
    assert h.pid in {p.pid for p in sandbox.commands.list()}
    again = sandbox.commands.connect(h.pid)
    sandbox.commands.send_stdin(h.pid, "z\n")
    r = again.wait()
    assert r.stdout == "second:z\n"


def test_sigterm_is_delivered(sandbox: Sandbox) -> None:
    h = sandbox.commands.run(
        "trap 'echo got-term; exit 7' TERM; echo ready; while true; do sleep 0.05; done",
        background=True,
    )
    for out, _, _ in h:
        if out and "ready" in out:
            break
    sandbox.commands._rpc.send_signal(
        process_pb.SendSignalRequest(
            process=process_pb.ProcessSelector(selector=cast(Any, Oneof("pid", h.pid))),
            signal=process_pb.Signal.SIGTERM,
        )
    )
    with pytest.raises(CommandExitException) as info:
        h.wait()
    assert info.value.exit_code == 7
    assert "got-term" in (info.value.stdout or "")


def test_signal_death_reports_go_style_status(sandbox: Sandbox) -> None:
    with pytest.raises(CommandExitException) as info:
        sandbox.commands.run("kill -TERM $$")
    assert info.value.exit_code == -1
    assert info.value.error == "signal: terminated"


def test_unknown_pid_rpcs_are_not_found(sandbox: Sandbox) -> None:
    sel = process_pb.ProcessSelector(selector=cast(Any, Oneof("pid", 999_999)))
    with pytest.raises(ConnectError) as info:
        sandbox.commands._rpc.close_stdin(process_pb.CloseStdinRequest(process=sel))
    assert info.value.code == Code.NOT_FOUND


def test_parallel_commands(sandbox: Sandbox) -> None:
    results: list[str] = []

    def run(i: int) -> None:
        results.append(sandbox.commands.run(f"echo {i}").stdout)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == sorted(f"{i}\n" for i in range(8))


def _rss_mib(pid: int, key: str = "VmRSS") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def test_output_backpressure_bounds_memory(sandbox: Sandbox, envd: Envd) -> None:
    """A stream that is not read must block the process, not fill envd's memory."""
    h = sandbox.commands.run("head -c 400000000 /dev/zero; echo done", background=True)
    try:

        def writer_blocked() -> bool:
            for p in sandbox.commands.list():
                if p.pid == h.pid:
                    break
            else:
                return False
            with open(f"/proc/{h.pid}/task/{h.pid}/children") as f:
                kids = f.read().split()
            for k in kids:
                with open(f"/proc/{k}/wchan") as f:
                    if "pipe_write" in f.read():
                        return True
            return False

        eventually_sync(writer_blocked, timeout=20)
        assert _rss_mib(envd.proc.pid) < 150
    finally:
        h.kill()
