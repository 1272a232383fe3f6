"""PTYs through `sandbox.pty`: a real terminal, echo, resize and kill."""

from __future__ import annotations

import pytest
from e2b import CommandExitException, Sandbox
from e2b.sandbox.commands.command_handle import PtySize

pytestmark = pytest.mark.timeout(30)


def _read_until(handle: object, needle: bytes, seen: bytearray) -> None:
    for _, _, pty in handle:  # type: ignore[attr-defined]
        if pty:
            seen += pty
            if needle in seen:
                return
    raise AssertionError(f"{needle!r} never arrived; got {bytes(seen)!r}")


def test_pty_echo_and_exit(sandbox: Sandbox) -> None:
    h = sandbox.pty.create(PtySize(rows=24, cols=80))
    sandbox.pty.send_stdin(h.pid, b"echo pty-$((40+2)); exit\n")
    seen = bytearray()
    _read_until(h, b"pty-42", seen)
    r = h.wait()
    assert r.exit_code == 0


def test_pty_is_a_terminal_and_resizes(sandbox: Sandbox) -> None:
    h = sandbox.pty.create(PtySize(rows=24, cols=80))
    try:
        seen = bytearray()
        sandbox.pty.send_stdin(h.pid, b"tty -s && echo IS-TTY; stty size\n")
        _read_until(h, b"24 80", seen)
        assert b"IS-TTY" in seen
        sandbox.pty.resize(h.pid, PtySize(rows=50, cols=132))
        sandbox.pty.send_stdin(h.pid, b"stty size\n")
        _read_until(h, b"50 132", seen)
    finally:
        assert sandbox.pty.kill(h.pid) is True
    with pytest.raises(CommandExitException) as info:
        h.wait()
    assert info.value.exit_code == -1


def test_pty_env_and_connect(sandbox: Sandbox) -> None:
    h = sandbox.pty.create(PtySize(rows=24, cols=80), envs={"PTYVAR": "v1"})
    h.disconnect()
    again = sandbox.pty.connect(h.pid)
    sandbox.pty.send_stdin(h.pid, b"echo $TERM-$PTYVAR; exit 5\n")
    seen = bytearray()
    _read_until(again, b"xterm-256color-v1", seen)
    with pytest.raises(CommandExitException) as info:
        again.wait()
    assert info.value.exit_code == 5


def test_pty_kill_unknown(sandbox: Sandbox) -> None:
    assert sandbox.pty.kill(999_999) is False
