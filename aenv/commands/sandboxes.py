"""Sandbox lifecycle from the command line: start, cn, ls, pause, resume, timeout, rm, fork.

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
    sdk_errors,
)
from aenv.output import Format, emit

if TYPE_CHECKING:
    from e2b import Sandbox, SandboxInfo

__all__ = ["register"]

ENVD_READY_S = 120  # a fresh guest under TCG can take tens of seconds to answer


def _pairs(values: list[str] | None, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values or []:
        k, sep, x = v.partition("=")
        if not sep or not k:
            die(f"{what} must be KEY=VALUE, got {v!r}", EXIT_USAGE)
        out[k] = x
    return out


def _wait_for_envd(sbx: Sandbox) -> None:
    """`create` returns once the VM is placed; the shell needs envd answering inside it."""
    deadline = time.monotonic() + ENVD_READY_S
    while not sbx.is_running(request_timeout=10):
        if time.monotonic() > deadline:
            die(f"sandbox {sbx.sandbox_id} started but envd did not answer within "
                f"{ENVD_READY_S}s", 3)  # fmt: skip
        time.sleep(0.2)


def _shell(sbx: Sandbox) -> int:
    """The shell's exit code (like ssh); errors exit through `sdk_errors`."""
    from aenv.commands.terminal import attach

    with sdk_errors("shell"):
        return attach(sbx)


def start(
    template: Annotated[str, typer.Argument(help="Template (name or ID) to start from.")] = "base",
    detach: Annotated[bool, typer.Option("-d", "--detach",
                      help="Print the sandbox ID and return instead of opening a shell.")] = False,
    timeout: Annotated[int, typer.Option("--timeout", "-t", min=1,
                       help="Seconds until the sandbox expires (extend with `aenv timeout`).")
                       ] = 300,
    metadata: Annotated[list[str] | None, typer.Option("--metadata", "-m",
                        help="KEY=VALUE metadata, repeatable (filter with `aenv ls -m`).")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", "-e",
                   help="KEY=VALUE environment variable for processes, repeatable.")] = None,
    rm: Annotated[bool, typer.Option("--rm", help="Kill the sandbox when the shell exits.")
                  ] = False,
    api_url: ApiUrl = None, api_key: ApiKey = None, data_dir: DataDir = DEFAULT_DATA,
) -> None:  # fmt: skip
    """Start a sandbox from TEMPLATE (default: base) and open a shell in it.

    Ctrl-D or `exit` leaves the shell; the sandbox keeps running unless --rm.
    With -d, print the new sandbox's ID and return instead.
    """
    from e2b import Sandbox

    conn = connection(api_url, api_key, data_dir)
    meta, envs = _pairs(metadata, "--metadata"), _pairs(env, "--env")
    with sdk_errors("start"):
        sbx = Sandbox.create(template, timeout=timeout, metadata=meta or None,
                             envs=envs or None, **conn.sdk_opts())  # fmt: skip
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
        typer.echo(f"aenv: sandbox {sbx.sandbox_id} keeps running: "
                   f"`aenv cn {sbx.sandbox_id}` to return, `aenv rm` to end it",
                   err=True)  # fmt: skip
    raise typer.Exit(code)


def cn(
    sandbox_id: SandboxId,
    timeout: Annotated[int | None, typer.Option("--timeout", "-t", min=1,
                       help="Make the sandbox live at least this many more seconds.")] = None,
    api_url: ApiUrl = None, api_key: ApiKey = None, data_dir: DataDir = DEFAULT_DATA,
) -> None:  # fmt: skip
    """Connect to SANDBOX_ID with an interactive shell, resuming it first if it is paused."""
    from e2b import Sandbox

    conn = connection(api_url, api_key, data_dir)
    with sdk_errors(f"cn {sandbox_id}", sandbox_id=sandbox_id):
        sbx = Sandbox.connect(sandbox_id, timeout=timeout, **conn.sdk_opts())
        _wait_for_envd(sbx)
    raise typer.Exit(_shell(sbx))


def _row(info: SandboxInfo) -> dict[str, Any]:
    return {
        "sandbox_id": info.sandbox_id,
        "template": info.name or info.template_id,
        "template_id": info.template_id,
        "state": info.state.value,
        "started_at": info.started_at.isoformat(),
        "end_at": info.end_at.isoformat(),
        "cpu_count": info.cpu_count,
        "memory_mb": info.memory_mb,
        "metadata": info.metadata,
    }


def _ago(seconds: float) -> str:
    s = int(abs(seconds))
    text = f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
    return text if seconds >= 0 else f"-{text}"


def _human(row: dict[str, Any]) -> dict[str, Any]:
    """Table form of a row: how long ago it started and how long it has left."""
    now = datetime.now(UTC)
    started = datetime.fromisoformat(row["started_at"])
    ends = datetime.fromisoformat(row["end_at"])
    return {**row, "age": _ago((now - started).total_seconds()),
            "expires_in": _ago((ends - now).total_seconds())}  # fmt: skip


def ls(
    output: Annotated[Format, typer.Option("--output", "-o",
                      help="table on a terminal, json when piped; or force one.")
                      ] = Format.auto,
    state: Annotated[list[str] | None, typer.Option("--state", "-s",
                     help="Only sandboxes in this state (running, paused), repeatable.")] = None,
    metadata: Annotated[list[str] | None, typer.Option("--metadata", "-m",
                        help="Only sandboxes with this KEY=VALUE metadata, repeatable.")] = None,
    api_url: ApiUrl = None, api_key: ApiKey = None, data_dir: DataDir = DEFAULT_DATA,
) -> None:  # fmt: skip
    """List running and paused sandboxes."""
    from e2b import Sandbox, SandboxQuery, SandboxState

    conn = connection(api_url, api_key, data_dir)
    try:
        states = [SandboxState(s) for s in state] if state else None
    except ValueError:
        die(f"--state must be one of: {', '.join(s.value for s in SandboxState)}", EXIT_USAGE)
    query = SandboxQuery(metadata=_pairs(metadata, "--metadata") or None, state=states)
    rows: list[dict[str, Any]] = []
    with sdk_errors("ls"):
        pages = Sandbox.list(query=query, **conn.sdk_opts())
        while pages.has_next:
            rows.extend(_row(i) for i in pages.next_items())
    rows.sort(key=lambda r: str(r["started_at"]))
    columns = ["sandbox_id", "template", "state", "age", "expires_in", "metadata"]
    emit(rows, columns, output, human=_human)


def pause(
    sandbox_id: SandboxId,
    api_url: ApiUrl = None, api_key: ApiKey = None, data_dir: DataDir = DEFAULT_DATA,
) -> None:  # fmt: skip
    """Pause SANDBOX_ID: memory, processes and files are kept until it is resumed."""
    from e2b import Sandbox

    conn = connection(api_url, api_key, data_dir)
    with sdk_errors(f"pause {sandbox_id}", sandbox_id=sandbox_id):
        Sandbox.pause(sandbox_id, **conn.sdk_opts())


def resume(
    sandbox_id: SandboxId,
    timeout: Annotated[int | None, typer.Option("--timeout", "-t", min=1,
                       help="Seconds the resumed sandbox lives (default: the server's).")
                       ] = None,
    api_url: ApiUrl = None, api_key: ApiKey = None, data_dir: DataDir = DEFAULT_DATA,
) -> None:  # fmt: skip
    """Resume a paused SANDBOX_ID where it left off (a running one just stays running)."""
    from e2b import Sandbox

    conn = connection(api_url, api_key, data_dir)
    with sdk_errors(f"resume {sandbox_id}", sandbox_id=sandbox_id):
        Sandbox.connect(sandbox_id, timeout=timeout, **conn.sdk_opts())


def timeout(
    sandbox_id: SandboxId,
    seconds: Annotated[int | None, typer.Argument(min=1, show_default=False,
                       help="New lifetime from now, in seconds; omit to print what is left.")
                       ] = None,
    api_url: ApiUrl = None, api_key: ApiKey = None, data_dir: DataDir = DEFAULT_DATA,
) -> None:  # fmt: skip
    """Set SANDBOX_ID to expire SECONDS from now, or print the seconds it has left."""
    from e2b import Sandbox

    conn = connection(api_url, api_key, data_dir)
    with sdk_errors(f"timeout {sandbox_id}", sandbox_id=sandbox_id):
        if seconds is not None:
            Sandbox.set_timeout(sandbox_id, seconds, **conn.sdk_opts())
            return
        info = Sandbox.get_info(sandbox_id, **conn.sdk_opts())
    left = (info.end_at - datetime.now(UTC)).total_seconds()
    typer.echo(str(max(0, round(left))))


def rm(
    sandbox_ids: Annotated[list[str], typer.Argument(help="IDs of the sandboxes to kill.",
                           show_default=False)],
    api_url: ApiUrl = None, api_key: ApiKey = None, data_dir: DataDir = DEFAULT_DATA,
) -> None:  # fmt: skip
    """Kill sandboxes (running or paused) and delete their state; exit 1 if one is unknown."""
    from e2b import Sandbox

    conn = connection(api_url, api_key, data_dir)
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
    timeout: Annotated[int | None, typer.Option("--timeout", "-t", min=1,
                       help="Seconds each child lives (default: its parent's timeout).")] = None,
    api_url: ApiUrl = None, api_key: ApiKey = None, data_dir: DataDir = DEFAULT_DATA,
) -> None:  # fmt: skip
    """Fork running SANDBOX_ID into -n children; print their IDs, one per line.

    Each child is a copy-on-write copy of the parent's memory, processes and files at the
    moment of the fork. Exit 1 if any child failed (the others are still printed).
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
    for fn in (start, cn, ls, pause, resume, timeout, rm, fork):
        app.command()(fn)
