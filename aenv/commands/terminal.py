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
    from e2b import CommandExitException

    out = sys.stdout.buffer
    # timeout=0: an interactive session lasts as long as the user wants it to
    handle = sbx.pty.create(_size(fd_in), timeout=0)
    wake_r, wake_w = os.pipe()  # the reader thread and SIGWINCH wake the input loop through it
    code: list[int] = []
    failure: list[BaseException] = []

    def write(data: bytes) -> None:
        out.write(data)
        out.flush()

    def read_output() -> None:
        try:
            code.append(handle.wait(on_pty=write).exit_code)
        except CommandExitException as e:
            code.append(e.exit_code)
        except BaseException as e:  # surfaced by the main thread, after the terminal is back
            failure.append(e)
        finally:
            os.write(wake_w, _QUIT)

    def on_winch(_sig: int, _frame: FrameType | None) -> None:
        os.write(wake_w, _WINCH)  # resize from the loop: no HTTP call inside a signal handler

    reader = threading.Thread(target=read_output, name="pty-output", daemon=True)
    old_winch = signal.signal(signal.SIGWINCH, on_winch)
    stdin_open = True
    try:
        with _raw(fd_in):
            reader.start()
            while True:
                fds = [wake_r, fd_in] if stdin_open else [wake_r]
                ready, _, _ = select.select(fds, [], [], IDLE_CHECK_S)
                if not ready:
                    if not sbx.is_running(request_timeout=10):
                        raise _gone(sbx.sandbox_id)
                    continue
                if wake_r in ready and _QUIT in os.read(wake_r, 64):
                    break
                try:
                    if wake_r in ready:
                        sbx.pty.resize(handle.pid, _size(fd_in))
                    if fd_in in ready:
                        data = os.read(fd_in, 4096)
                        # the terminal hung up: end the shell as Ctrl-D at its prompt would
                        stdin_open = bool(data)
                        sbx.pty.send_stdin(handle.pid, data or b"\x04")
                except Exception:
                    # typing while the shell exits races its end: the reader's outcome wins
                    reader.join(timeout=5)
                    if reader.is_alive():
                        raise
                    break
    finally:
        signal.signal(signal.SIGWINCH, old_winch)
        if reader.is_alive():  # we are leaving on an error: end the guest shell, stop reading
            with contextlib.suppress(Exception):
                handle.kill()
            with contextlib.suppress(Exception):
                handle.disconnect()
            reader.join(timeout=1)  # a daemon thread: a stream stuck on a dead VM can't hold us
        if not reader.is_alive():  # a stuck reader may still write: leave its pipe open
            os.close(wake_r)
            os.close(wake_w)
    if failure:
        # The stream broke: because the sandbox went away (the proxy ends streams of a
        # killed or paused sandbox), or for another reason worth showing as is.
        gone = False
        with contextlib.suppress(Exception):
            gone = not sbx.is_running(request_timeout=10)
        if gone:
            raise _gone(sbx.sandbox_id) from failure[0]
        raise failure[0]
    return code[0] if code else 0
