"""Run one command in a sandbox (`aenv exec`) and move files in and out (`upload`,
`download`): the non-interactive half of the CLI, made for scripts.

`exec` streams the guest's stdout and stderr to ours as they arrive, separately, and exits
with the guest command's own exit code, so `aenv exec ID -- make test && …` composes.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Annotated, BinaryIO

import typer

from aenv.commands.common import (
    DEFAULT_DATA,
    EXIT_FAILED,
    EXIT_USAGE,
    ApiKey,
    ApiUrl,
    DataDir,
    SandboxId,
    connection,
    die,
    sdk_errors,
)

if TYPE_CHECKING:
    from e2b import Sandbox

    from aenv.config import Connection

__all__ = ["register"]



def _connect(sandbox_id: str, conn: Connection) -> Sandbox:
    """A handle with envd's token; a paused sandbox is resumed, as `Sandbox.connect` does."""
    from e2b import Sandbox

    return Sandbox.connect(sandbox_id, **conn.sdk_opts())


def _pump_stdin(sbx: Sandbox, pid: int) -> None:
    """Copy our stdin to the guest process on a thread (the output streams meanwhile), then
    close its stdin so `cat`, `wc` and friends see end of input."""
    import threading

    fd = sys.stdin.fileno()

    def pump() -> None:
        try:
            while chunk := os.read(fd, 64 * 1024):
                sbx.commands.send_stdin(pid, chunk)
            sbx.commands.close_stdin(pid)
        except Exception:
            pass  # the process ended first: what it printed and its exit code tell the story

    threading.Thread(target=pump, name="exec-stdin", daemon=True).start()


def exec_(
    sandbox_id: SandboxId,
    command: Annotated[list[str], typer.Argument(show_default=False,
                       help="Command and arguments, after `--`. One argument is run as a "
                       "shell line (`'ls | wc -l'`); several are quoted as an argv.")],
    cwd: Annotated[str | None, typer.Option("--cwd", "-w", help="Working directory.")] = None,
    user: Annotated[str | None, typer.Option("--user", "-u",
                    help="Guest user to run as (default: the sandbox's, `user`).")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", "-e",
                   help="KEY=VALUE environment variable, repeatable.")] = None,
    timeout: Annotated[float, typer.Option("--timeout", "-t", min=0,
                       help="Seconds before the command is killed; 0 waits forever.")] = 0,
    interactive: Annotated[bool, typer.Option("--interactive", "-i",
                           help="Forward our stdin to the command; end of input closes its "
                           "stdin (`aenv exec -i ID -- wc -l < file`).")] = False,
    api_url: ApiUrl = None, api_key: ApiKey = None, data_dir: DataDir = DEFAULT_DATA,
) -> None:  # fmt: skip
    """Run COMMAND in SANDBOX_ID, streaming its stdout and stderr; exit with its exit code.

    Example: aenv exec SANDBOX_ID -- python3 -c 'print(42)'
    """
    from e2b import CommandExitException

    envs: dict[str, str] = {}
    for v in env or []:
        k, sep, x = v.partition("=")
        if not sep or not k:
            die(f"--env must be KEY=VALUE, got {v!r}", EXIT_USAGE)
        envs[k] = x
    line = command[0] if len(command) == 1 else shlex.join(command)
    conn = connection(api_url, api_key, data_dir)

    def out(s: str) -> None:
        sys.stdout.write(s)
        sys.stdout.flush()

    def err(s: str) -> None:
        sys.stderr.write(s)
        sys.stderr.flush()

    with sdk_errors(f"exec {sandbox_id}"):
        sbx = _connect(sandbox_id, conn)
        try:
            if interactive:
                handle = sbx.commands.run(line, background=True, stdin=True, cwd=cwd, user=user,
                                          envs=envs or None, timeout=timeout)  # fmt: skip
                _pump_stdin(sbx, handle.pid)
                handle.wait(on_stdout=out, on_stderr=err)
            else:
                sbx.commands.run(line, on_stdout=out, on_stderr=err, cwd=cwd, user=user,
                                 envs=envs or None, timeout=timeout, stdin=False,
                                 retain_output=False)  # fmt: skip
        except CommandExitException as e:
            # a guest killed by a signal reports no code in 1..255: call that a plain failure
            code = e.exit_code if 0 < e.exit_code < 256 else EXIT_FAILED
            raise typer.Exit(code) from None


#: How much of a stream each upload chunk holds: few syscalls and HTTP chunks for a fast
#: pipe, and memory stays flat whatever the size.
UPLOAD_CHUNK = 1024 * 1024


def send_stream(sbx: Sandbox, stream: BinaryIO, remote: str) -> int:
    """Write everything `stream` holds to `remote` in the sandbox; returns the bytes sent.

    The bytes go as chunks (`Transfer-Encoding: chunked`) read until end of input, never as
    the file object itself: httpx gives a file object the `Content-Length` its fstat
    reports, which for a pipe is 0 — `cat f | aenv upload ID - PATH` then sent nothing and
    exited 0. Afterwards the file's size in the sandbox must be what was sent.
    """
    sent = 0

    def chunks() -> Iterator[bytes]:
        nonlocal sent
        while chunk := stream.read(UPLOAD_CHUNK):
            sent += len(chunk)
            yield chunk

    sbx.files.write(remote, chunks())
    size = sbx.files.get_info(remote).size
    if size != sent:
        raise UploadMismatch(f"sent {sent} bytes, but {remote} has {size} in the sandbox")
    return sent


class UploadMismatch(Exception):
    """The file in the sandbox does not have the bytes we sent (e.g. a guest process wrote
    it meanwhile)."""


def upload(
    sandbox_id: SandboxId,
    local: Annotated[str, typer.Argument(show_default=False,
                     help="Local file to send; `-` reads stdin.")],
    remote: Annotated[str, typer.Argument(show_default=False,
                      help="Path in the sandbox; ending in `/` keeps the local file name.")],
    api_url: ApiUrl = None, api_key: ApiKey = None, data_dir: DataDir = DEFAULT_DATA,
) -> None:  # fmt: skip
    """Copy the file LOCAL into SANDBOX_ID at REMOTE (parent directories are created)."""
    if remote.endswith("/"):
        if local == "-":
            die("give a file name for REMOTE when uploading stdin", EXIT_USAGE)
        remote += Path(local).name
    if local != "-" and not Path(local).exists():
        die(f"{local}: no such file", EXIT_FAILED)
    if local != "-" and Path(local).is_dir():
        die(f"{local}: is a directory", EXIT_USAGE)
    conn = connection(api_url, api_key, data_dir)
    with sdk_errors(f"upload {remote}"):
        sbx = _connect(sandbox_id, conn)
        try:
            if local == "-":
                send_stream(sbx, sys.stdin.buffer, remote)
            else:
                with open(local, "rb") as f:
                    send_stream(sbx, f, remote)
        except (OSError, UploadMismatch) as e:  # reading our side failed, or a short file
            die(f"upload {remote}: {e}", EXIT_FAILED)


def download(
    sandbox_id: SandboxId,
    remote: Annotated[str, typer.Argument(show_default=False, help="File in the sandbox.")],
    local: Annotated[str, typer.Argument(show_default=False,
                     help="Where to write it; a directory keeps the remote name; `-` is "
                     "stdout.")],
    api_url: ApiUrl = None, api_key: ApiKey = None, data_dir: DataDir = DEFAULT_DATA,
) -> None:  # fmt: skip
    """Copy the file REMOTE out of SANDBOX_ID to LOCAL."""
    target = Path(local)
    if local != "-" and target.is_dir():
        target = target / PurePosixPath(remote).name
    conn = connection(api_url, api_key, data_dir)
    with sdk_errors(f"download {remote}"):
        sbx = _connect(sandbox_id, conn)
        chunks = sbx.files.read(remote, format="stream")
        if local == "-":
            for chunk in chunks:
                sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
            return
        # write beside the target and rename: an interrupted download leaves no half file
        partial = target.with_name(f".{target.name}.aenv-partial")
        try:
            with open(partial, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
            partial.replace(target)
        finally:
            partial.unlink(missing_ok=True)


def register(app: typer.Typer) -> None:
    app.command("exec")(exec_)
    app.command()(upload)
    app.command()(download)
