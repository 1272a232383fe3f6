"""A guest command whose output streams to ours and whose stdin, when asked, is ours: what
`aenv exec` runs, and what `aenv start`/`cn` run instead of a terminal when our stdin is not
one (`echo 'make test' | aenv start`), as ssh runs a remote shell without a PTY then.

Without a terminal there is no line discipline to turn end of input into Ctrl-D: a PTY
takes the piped bytes before the guest's shell has set its modes and drops the Ctrl-D we
send after them, so the shell waited for ever. A shell reading a pipe ends at end of input
by itself, with the exit code of its last command.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from e2b import Sandbox

__all__ = ["SHELL_SCRIPT", "CommandTimedOut", "run_piped"]

#: The command a piped session runs: the shell envd started for the command (a login
#: `bash`, or the image's `sh` where it has no bash), again, reading its script from stdin.
SHELL_SCRIPT = 'exec "$0"'
#: How much of our stdin one message to the guest carries.
STDIN_CHUNK = 64 * 1024


@dataclass
class CommandTimedOut(Exception):
    """The command ran longer than its `timeout` and envd killed it."""

    seconds: float


def _pump_stdin(sbx: Sandbox, pid: int) -> None:
    """Copy our stdin to the guest process on a thread (the output streams meanwhile), then
    close its stdin so `cat`, `wc` and shells reading a script see end of input."""
    fd = sys.stdin.fileno()

    def pump() -> None:
        try:
            while chunk := os.read(fd, STDIN_CHUNK):
                sbx.commands.send_stdin(pid, chunk)
            sbx.commands.close_stdin(pid)
        except Exception:
            pass  # the process ended first: what it printed and its exit code tell the story

    threading.Thread(target=pump, name="guest-stdin", daemon=True).start()


def _out(s: str) -> None:
    sys.stdout.write(s)
    sys.stdout.flush()


def _err(s: str) -> None:
    sys.stderr.write(s)
    sys.stderr.flush()


def run_piped(
    sbx: Sandbox,
    line: str,
    *,
    stdin: bool,
    timeout: float = 0,
    cwd: str | None = None,
    user: str | None = None,
    envs: dict[str, str] | None = None,
) -> int:
    """Run the shell line `line` in `sbx`, its stdout and stderr streamed to ours as they
    arrive, our stdin forwarded when `stdin`; return its exit code (1 for a process a signal
    ended: it reports none in 1..255). A `timeout` (seconds, 0 for none) that passes raises
    `CommandTimedOut`; the SDK's errors (sandbox gone, …) are raised as they are."""
    from e2b import CommandExitException, TimeoutException

    started = time.monotonic()
    try:
        if stdin:
            handle = sbx.commands.run(
                line, background=True, stdin=True, cwd=cwd, user=user, envs=envs, timeout=timeout
            )
            _pump_stdin(sbx, handle.pid)
            handle.wait(on_stdout=_out, on_stderr=_err)
        else:
            sbx.commands.run(
                line,
                on_stdout=_out,
                on_stderr=_err,
                cwd=cwd,
                user=user,
                envs=envs,
                timeout=timeout,
                stdin=False,
                retain_output=False,
            )
    except CommandExitException as e:
        return e.exit_code if 0 < e.exit_code < 256 else 1
    except TimeoutException as e:
        if timeout and _deadline_passed(e, time.monotonic() - started, timeout):
            raise CommandTimedOut(timeout) from e
        raise
    return 0


def _deadline_passed(e: Exception, elapsed: float, timeout: float) -> bool:
    """Whether the SDK's TimeoutException is the command's own deadline (envd ends the
    stream with `deadline_exceeded` and kills the process; the SDK's message then names its
    `request_timeout` option, which is no help here), not the sandbox going away — the SDK
    raises that as a TimeoutException too."""
    from e2b import SandboxNotRunningException, SandboxUnreachableException

    gone = isinstance(e, SandboxNotRunningException | SandboxUnreachableException)
    return not gone and elapsed >= timeout
