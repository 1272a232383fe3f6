"""Run one command in a sandbox (`aenv exec`) and move files in and out (`upload`,
`download`): the non-interactive half of the CLI, made for scripts.

`exec` streams the guest's stdout and stderr to ours as they arrive, separately, and exits
with the guest command's own exit code, so `aenv exec ID -- make test && …` composes.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Annotated, BinaryIO

import typer

from aenv.commands.common import (
    DEFAULT_DATA,
    EXIT_FAILED,
    EXIT_TIMED_OUT,
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
    """A handle with envd's token; a paused sandbox is resumed for the time it kept."""
    from aenv.commands.sandbox_api import connect

    return connect(sandbox_id, conn)


def exec_(
    sandbox_id: SandboxId,
    command: Annotated[
        list[str],
        typer.Argument(
            show_default=False,
            help="Command and arguments, after `--`. One argument is run as a "
            "shell line (`'ls | wc -l'`); several are quoted as an argv.",
        ),
    ],
    cwd: Annotated[str | None, typer.Option("--cwd", "-w", help="Working directory.")] = None,
    user: Annotated[
        str | None,
        typer.Option("--user", "-u", help="Guest user to run as (default: the sandbox's, `user`)."),
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", "-e", help="KEY=VALUE environment variable, repeatable."),
    ] = None,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            "-t",
            min=0,
            help="Seconds before the command is killed (then exit 124, as "
            "timeout(1)); 0 waits forever.",
        ),
    ] = 0,
    interactive: Annotated[
        bool,
        typer.Option(
            "--interactive",
            "-i",
            help="Forward our stdin to the command; end of input closes its "
            "stdin (`aenv exec -i ID -- wc -l < file`).",
        ),
    ] = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """Run COMMAND in SANDBOX_ID, streaming its stdout and stderr; exit with its exit code.

    Example: aenv exec SANDBOX_ID -- python3 -c 'print(42)'
    """
    from aenv.commands.piped import CommandTimedOut, run_piped

    envs: dict[str, str] = {}
    for v in env or []:
        k, sep, x = v.partition("=")
        if not sep or not k:
            die(f"--env must be KEY=VALUE, got {v!r}", EXIT_USAGE)
        envs[k] = x
    line = command[0] if len(command) == 1 else shlex.join(command)
    conn = connection(api_url, api_key, data_dir)
    with sdk_errors(f"exec {sandbox_id}", sandbox_id=sandbox_id):
        sbx = _connect(sandbox_id, conn)
        try:
            code = run_piped(
                sbx, line, stdin=interactive, timeout=timeout, cwd=cwd, user=user, envs=envs or None
            )
        except CommandTimedOut as e:
            die(
                f"exec {sandbox_id}: the command timed out after {e.seconds:g} s and was "
                "killed; give -t more seconds (0: no limit)",
                EXIT_TIMED_OUT,
            )
    raise typer.Exit(code)


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
    local: Annotated[
        str, typer.Argument(show_default=False, help="Local file to send; `-` reads stdin.")
    ],
    remote: Annotated[
        str,
        typer.Argument(
            show_default=False, help="Path in the sandbox; ending in `/` keeps the local file name."
        ),
    ],
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """Copy the file LOCAL into SANDBOX_ID at REMOTE (parent directories are created)."""
    if remote.endswith("/"):
        if local == "-":
            die("give a file name for REMOTE when uploading stdin", EXIT_USAGE)
        remote += Path(local).name
    if local != "-" and Path(local).is_dir():
        die(
            f"{local} is a directory and upload sends one file: send it as an archive, "
            f"`tar c -C {local} . | aenv upload {sandbox_id} - /tmp/dir.tar`, then "
            f"`aenv exec {sandbox_id} -- tar x -f /tmp/dir.tar -C DEST`",
            EXIT_USAGE,
        )
    if local != "-" and not Path(local).exists():
        die(f"{local}: no such file on this machine", EXIT_FAILED)
    conn = connection(api_url, api_key, data_dir)
    with _file_errors("upload", sandbox_id, remote):
        sbx = _connect(sandbox_id, conn)
        try:
            if local == "-":
                send_stream(sbx, sys.stdin.buffer, remote)
            else:
                with open(local, "rb") as f:
                    send_stream(sbx, f, remote)
        except (OSError, UploadMismatch) as e:  # reading our side failed, or a short file
            die(f"upload {remote}: {e}", EXIT_FAILED)


@contextmanager
def _file_errors(verb: str, sandbox_id: str, remote: str) -> Iterator[None]:
    """`sdk_errors`, and what to give instead when REMOTE is a directory: envd refuses to
    write or read one as a file ("path … is a directory", the SDK's
    InvalidArgumentException)."""
    from e2b import InvalidArgumentException

    with sdk_errors(f"{verb} {remote}", sandbox_id=sandbox_id):
        try:
            yield
        except InvalidArgumentException as e:
            if "is a directory" not in str(e):
                raise
            sid = sandbox_id
            hint = (
                f"end REMOTE with / to put the file in it ({remote.rstrip('/')}/)"
                if verb == "upload"
                else f"download copies one file: pack it first, `aenv exec {sid} -- tar cf "
                f"/tmp/dir.tar -C {remote} .`, then `aenv download {sid} /tmp/dir.tar .`"
            )
            die(f"{verb} {remote}: it is a directory in the sandbox: {hint}", EXIT_USAGE)


def download(
    sandbox_id: SandboxId,
    remote: Annotated[str, typer.Argument(show_default=False, help="File in the sandbox.")],
    local: Annotated[
        str,
        typer.Argument(
            show_default=False,
            help="Where to write it; a directory keeps the remote name; `-` is stdout.",
        ),
    ],
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """Copy the file REMOTE out of SANDBOX_ID to LOCAL."""
    target = Path(local)
    if local != "-" and target.is_dir():
        target = target / PurePosixPath(remote).name
    conn = connection(api_url, api_key, data_dir)
    with _file_errors("download", sandbox_id, remote):
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
