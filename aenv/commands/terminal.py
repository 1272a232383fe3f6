"""An interactive shell in a sandbox: the local terminal in raw mode bridged to a guest PTY.

Keystrokes go to the guest unchanged (so Ctrl-C, Ctrl-D, arrows and tab completion act
there, not here); output comes back on a reader thread; SIGWINCH resizes the guest PTY.
The terminal is always restored, whatever ends the session. With stdin not a terminal
there is no PTY: our input is the shell's script (`aenv.commands.piped`), as with ssh.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import termios
import threading
import tty
from collections.abc import Iterator
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from e2b import Sandbox
    from e2b.sandbox.commands.command_handle import PtySize

__all__ = ["attach"]

_QUIT, _WINCH = b"q", b"w"
# A killed or expired sandbox does not always end the PTY stream (the proxy may keep it
# open), so an idle session asks envd whether it is still there this often.
IDLE_CHECK_S = 3.0


def _gone(sandbox_id: str) -> Exception:
    from e2b import SandboxNotRunningException

    return SandboxNotRunningException(f"sandbox {sandbox_id} stopped running")


def _size(fd: int) -> PtySize:
    from e2b import PtySize

    try:
        cols, rows = os.get_terminal_size(fd)
    except OSError:
        cols, rows = 80, 24  # not a terminal: a conventional size
    return PtySize(rows=rows or 24, cols=cols or 80)


@contextlib.contextmanager
def _raw(fd: int) -> Iterator[None]:
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def attach(sbx: Sandbox) -> int:
    """Run a login shell in `sbx` on this terminal until it exits; return its exit code.
    Our stdin not a terminal (a pipe, a file): the shell reads its commands from it, its
    output and errors come back apart, and it ends at end of input."""
    from aenv.commands.piped import SHELL_SCRIPT, run_piped

    fd_in = sys.stdin.fileno()
    if not os.isatty(fd_in):
        return run_piped(sbx, SHELL_SCRIPT, stdin=True)
    return _interactive(sbx, fd_in)


def _interactive(sbx: Sandbox, fd_in: int) -> int:
    session = _Session(sbx, fd_in)
    old_winch = signal.signal(signal.SIGWINCH, session.on_winch)
    try:
        with _raw(fd_in):
            session.reader.start()
            session.bridge()
    finally:
        signal.signal(signal.SIGWINCH, old_winch)
        session.close()
    return session.outcome()


class _Session:
    """One guest PTY bridged to the terminal: the input loop runs on the main thread, the
    PTY's output on a reader thread; both wake the loop through one pipe."""

    def __init__(self, sbx: Sandbox, fd_in: int) -> None:
        self.sbx = sbx
        self.fd_in = fd_in
        self.out = sys.stdout.buffer
        # timeout=0: an interactive session lasts as long as the user wants it to
        self.handle = sbx.pty.create(_size(fd_in), timeout=0)
        self.wake_r, self.wake_w = os.pipe()  # the reader thread and SIGWINCH wake the loop
        self.code: list[int] = []
        self.failure: list[BaseException] = []
        self.stdin_open = True
        self.reader = threading.Thread(target=self._read_output, name="pty-output", daemon=True)

    def _write(self, data: bytes) -> None:
        self.out.write(data)
        self.out.flush()

    def _read_output(self) -> None:
        from e2b import CommandExitException

        try:
            self.code.append(self.handle.wait(on_pty=self._write).exit_code)
        except CommandExitException as e:
            self.code.append(e.exit_code)
        except BaseException as e:  # surfaced by the main thread, after the terminal is back
            self.failure.append(e)
        finally:
            os.write(self.wake_w, _QUIT)

    def on_winch(self, _sig: int, _frame: FrameType | None) -> None:
        # resize from the loop: no HTTP call inside a signal handler
        os.write(self.wake_w, _WINCH)

    def bridge(self) -> None:
        """Keystrokes and resizes to the guest until the shell ends (or the sandbox does)."""
        while True:
            fds = [self.wake_r, self.fd_in] if self.stdin_open else [self.wake_r]
            ready, _, _ = select.select(fds, [], [], IDLE_CHECK_S)
            if not ready:
                if not self.sbx.is_running(request_timeout=10):
                    raise _gone(self.sbx.sandbox_id)
                continue
            if self.wake_r in ready and _QUIT in os.read(self.wake_r, 64):
                return
            try:
                self._forward(ready)
            except Exception:
                # typing while the shell exits races its end: the reader's outcome wins
                self.reader.join(timeout=5)
                if self.reader.is_alive():
                    raise
                return

    def _forward(self, ready: list[int]) -> None:
        pid = self.handle.pid
        if self.wake_r in ready:
            self.sbx.pty.resize(pid, _size(self.fd_in))
        if self.fd_in in ready:
            data = os.read(self.fd_in, 4096)
            # the terminal hung up: end the shell as Ctrl-D at its prompt would
            self.stdin_open = bool(data)
            self.sbx.pty.send_stdin(pid, data or b"\x04")

    def close(self) -> None:
        """A reader still running means we leave on an error: end the guest shell and stop
        reading (briefly: a daemon thread on a stream stuck on a dead VM can't hold us)."""
        if self.reader.is_alive():
            with contextlib.suppress(Exception):
                self.handle.kill()
            with contextlib.suppress(Exception):
                self.handle.disconnect()
            self.reader.join(timeout=1)
        if not self.reader.is_alive():  # a stuck reader may still write: leave its pipe open
            os.close(self.wake_r)
            os.close(self.wake_w)

    def outcome(self) -> int:
        """The shell's exit code, or why the session broke."""
        if self.failure:
            # The stream broke: because the sandbox went away (the proxy ends streams of a
            # killed or paused sandbox), or for another reason worth showing as is.
            gone = False
            with contextlib.suppress(Exception):
                gone = not self.sbx.is_running(request_timeout=10)
            if gone:
                raise _gone(self.sbx.sandbox_id) from self.failure[0]
            raise self.failure[0]
        return self.code[0] if self.code else 0
