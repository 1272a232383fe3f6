"""Sandbox lifecycle from the command line: start, cn, pause, resume, timeout, rm, fork.

Every command is a thin use of the e2b SDK against the resolved connection, so the CLI
exercises exactly the path an SDK user takes.
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

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
    pairs,
    sdk_errors,
)

if TYPE_CHECKING:
    from e2b import Sandbox

__all__ = ["register"]

ENVD_READY_S = 120  # a fresh guest under TCG can take tens of seconds to answer


def _wait_for_envd(sbx: Sandbox) -> None:
    """`create` returns once the VM is placed; the shell needs envd answering inside it."""
    deadline = time.monotonic() + ENVD_READY_S
    while not sbx.is_running(request_timeout=10):
        if time.monotonic() > deadline:
            die(
                f"sandbox {sbx.sandbox_id} started but envd did not answer within {ENVD_READY_S}s",
                3,
            )
        time.sleep(0.2)


def _shell(sbx: Sandbox) -> int:
    """The shell's exit code (like ssh); errors exit through `sdk_errors`."""
    from aenv.commands.terminal import attach

    with sdk_errors("shell"):
        return attach(sbx)


def start(
    template: Annotated[str, typer.Argument(help="Template (name or ID) to start from.")] = "base",
    detach: Annotated[
        bool,
        typer.Option(
            "-d", "--detach", help="Print the sandbox ID and return instead of opening a shell."
        ),
    ] = False,
    timeout: Annotated[
        int,
        typer.Option(
            "--timeout",
            "-t",
            min=1,
            help="Seconds until the sandbox expires (extend with `aenv timeout`).",
        ),
    ] = 300,
    metadata: Annotated[
        list[str] | None,
        typer.Option(
            "--metadata", "-m", help="KEY=VALUE metadata, repeatable (filter with `aenv ls -m`)."
        ),
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option(
            "--env", "-e", help="KEY=VALUE environment variable for processes, repeatable."
        ),
    ] = None,
    rm: Annotated[
        bool, typer.Option("--rm", help="Kill the sandbox when the shell exits.")
    ] = False,
    volume: Annotated[
        list[str] | None,
        typer.Option(
            "--volume",
            "-v",
            help="NAME:/PATH: mount volume NAME at /PATH, repeatable (aenv volume).",
        ),
    ] = None,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """Start a sandbox from TEMPLATE (default: base) and open a shell in it.

    Ctrl-D or `exit` leaves the shell; the sandbox keeps running unless --rm.
    With -d, print the new sandbox's ID and return instead.
    """
    from e2b import Sandbox, SandboxException

    conn = connection(api_url, api_key, data_dir)
    meta, envs = pairs(metadata, "--metadata"), pairs(env, "--env")
    mounts = _mounts(volume)
    with sdk_errors("start"):
        try:
            sbx = Sandbox.create(
                template,
                timeout=timeout,
                metadata=meta or None,
                envs=envs or None,
                volume_mounts=mounts or None,
                **conn.sdk_opts(),
            )
        except SandboxException as e:
            if e.status_code == 404 and "volume" not in str(e):  # (a volume's 404 says so)
                die(
                    f"start: no such template {template}: `aenv template ls` lists them, "
                    "`aenv snapshot ls` the snapshots",
                    EXIT_FAILED,
                )
            raise
        _wait_for_envd(sbx)
    if detach:
        typer.echo(sbx.sandbox_id)
        return
    leave = "Ctrl-D to leave" if sys.stdin.isatty() else "its shell reads our stdin"
    typer.echo(f"aenv: sandbox {sbx.sandbox_id} ({template}); {leave}", err=True)
    try:
        code = _shell(sbx)  # on failure: typer.Exit with the one-line message already out
    finally:
        if rm:
            with sdk_errors("rm"):
                sbx.kill()
    if not rm:
        typer.echo(
            f"aenv: sandbox {sbx.sandbox_id} keeps running: "
            f"`aenv cn {sbx.sandbox_id}` to return, `aenv rm` to end it",
            err=True,
        )
    raise typer.Exit(code)


def _mounts(raw: list[str] | None) -> dict[str, str | Any]:
    """`--volume NAME:/PATH` options as the SDK's `volume_mounts` ({path: name})."""
    out: dict[str, str | Any] = {}
    for item in raw or ():
        name, sep, path = item.partition(":")
        if not sep or not name or not path.startswith("/"):
            die(f"--volume {item!r}: expected NAME:/PATH", EXIT_USAGE)
        out[path] = name
    return out


def cn(
    sandbox_id: SandboxId,
    timeout: Annotated[
        int | None,
        typer.Option(
            "--timeout", "-t", min=1, help="Make the sandbox live at least this many more seconds."
        ),
    ] = None,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """Connect to SANDBOX_ID with an interactive shell, resuming it first if it is paused
    (for the time it kept, unless -t). With stdin not a terminal, the shell reads its
    commands from it: `aenv cn ID < script.sh`."""
    from aenv.commands.sandbox_api import connect

    conn = connection(api_url, api_key, data_dir)
    with sdk_errors(f"cn {sandbox_id}", sandbox_id=sandbox_id):
        sbx = connect(sandbox_id, conn, timeout)
        _wait_for_envd(sbx)
    raise typer.Exit(_shell(sbx))


def pause(
    sandbox_id: SandboxId,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """Pause SANDBOX_ID: memory, processes and files are kept until it is resumed."""
    from e2b import Sandbox

    conn = connection(api_url, api_key, data_dir)
    with sdk_errors(f"pause {sandbox_id}", sandbox_id=sandbox_id):
        Sandbox.pause(sandbox_id, **conn.sdk_opts())


def resume(
    sandbox_id: SandboxId,
    timeout: Annotated[
        int | None,
        typer.Option(
            "--timeout",
            "-t",
            min=1,
            help="Seconds the resumed sandbox lives (default: the time it kept, "
            "as `aenv timeout ID` shows it).",
        ),
    ] = None,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """Resume a paused SANDBOX_ID where it left off (a running one just stays running)."""
    from aenv.commands.sandbox_api import connect

    conn = connection(api_url, api_key, data_dir)
    with sdk_errors(f"resume {sandbox_id}", sandbox_id=sandbox_id):
        connect(sandbox_id, conn, timeout)


def timeout(
    sandbox_id: SandboxId,
    seconds: Annotated[
        int | None,
        typer.Argument(
            min=1,
            show_default=False,
            help="New lifetime from now, in seconds; omit to print what is left.",
        ),
    ] = None,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """Set SANDBOX_ID to expire SECONDS from now, or print the seconds it has left. A
    paused sandbox's clock stands still: it has what it kept (the seconds it runs once
    resumed), and SECONDS sets that."""
    from e2b import Sandbox

    from aenv.commands.listing import left_s, row
    from aenv.commands.sandbox_api import detail

    conn = connection(api_url, api_key, data_dir)
    with sdk_errors(f"timeout {sandbox_id}", sandbox_id=sandbox_id):
        if seconds is not None:
            Sandbox.set_timeout(sandbox_id, seconds, **conn.sdk_opts())
            return
        left = left_s(row(detail(sandbox_id, conn)), datetime.now(UTC))
    typer.echo(str(max(0, round(left))))


def rm(
    sandbox_ids: Annotated[
        list[str] | None, typer.Argument(show_default=False, help="IDs of the sandboxes to kill.")
    ] = None,
    all_: Annotated[
        bool,
        typer.Option(
            "--all", "-a", help="Kill every sandbox (running and paused; narrow with -s, -m)."
        ),
    ] = False,
    state: Annotated[
        list[str] | None,
        typer.Option(
            "--state",
            "-s",
            help="With --all or -m: only sandboxes in this state (running, paused), repeatable.",
        ),
    ] = None,
    metadata: Annotated[
        list[str] | None,
        typer.Option(
            "--metadata",
            "-m",
            help="Kill the sandboxes with this KEY=VALUE metadata, repeatable (all must match).",
        ),
    ] = None,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """Kill sandboxes (running or paused) and delete their state: those named (exit 1 if
    one is unknown), or every one with --all, or those with -m metadata — printing how
    many were killed (E2B's `sandbox kill [IDS] -a -s -m`)."""
    from e2b import Sandbox

    from aenv.commands.reap import kill_matching

    if (all_ or metadata) and sandbox_ids:
        die("give sandbox IDs, or --all / -m KEY=VALUE, not both", EXIT_USAGE)
    if state and not (all_ or metadata):
        die("-s narrows --all or -m: add one of them", EXIT_USAGE)
    conn = connection(api_url, api_key, data_dir)
    if all_ or metadata:
        kill_matching(conn, states=state or (), metadata=pairs(metadata, "--metadata"))
        return
    if not sandbox_ids:
        die("give the IDs of the sandboxes to kill, or --all, or -m KEY=VALUE", EXIT_USAGE)
    missing = []
    for sid in sandbox_ids:
        with sdk_errors(f"rm {sid}"):
            if not Sandbox.kill(sid, **conn.sdk_opts()):
                missing.append(sid)
    if missing:
        die(f"no such sandbox: {', '.join(missing)}", EXIT_FAILED)


def fork(
    sandbox_id: SandboxId,
    count: Annotated[int, typer.Option("--count", "-n", min=1, help="How many children.")] = 1,
    timeout: Annotated[
        int | None,
        typer.Option(
            "--timeout",
            "-t",
            min=1,
            help="Seconds each child lives (default: its parent's timeout).",
        ),
    ] = None,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """Fork SANDBOX_ID into -n children; print their IDs, one per line.

    Each child is a copy-on-write copy of the parent's memory, processes and files at the
    moment of the fork — of a paused sandbox, at its pause (the children spread over the
    nodes; the parent stays paused). Exit 1 if any child failed (the others are still
    printed).
    """
    from e2b import Sandbox

    conn = connection(api_url, api_key, data_dir)
    with sdk_errors(f"fork {sandbox_id}", sandbox_id=sandbox_id):
        results = Sandbox.fork(sandbox_id, count=count, timeout=timeout, **conn.sdk_opts())
    errors = [r for r in results if not isinstance(r, Sandbox)]
    for r in results:
        if isinstance(r, Sandbox):
            typer.echo(r.sandbox_id)
    for e in errors:
        typer.echo(f"aenv: fork {sandbox_id}: a child failed: {e}", err=True)
    if errors:
        raise typer.Exit(EXIT_FAILED)


def register(app: typer.Typer) -> None:
    for fn in (start, cn, pause, resume, timeout, rm, fork):
        app.command()(fn)
