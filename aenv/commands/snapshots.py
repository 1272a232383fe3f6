"""`aenv snapshot create|ls|fork|rm`: persistent snapshots (E2B's `Sandbox.create_snapshot`),
through the e2b SDK like every sandbox command.

A snapshot captures a running sandbox's memory, processes and files in place (the sandbox
runs on, same id and TTL) and becomes a template: `aenv start SNAPSHOT_ID` starts copies of
it. In aenv a snapshot's ID is its name.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from aenv.commands.common import (
    DEFAULT_DATA,
    EXIT_FAILED,
    ApiKey,
    ApiUrl,
    DataDir,
    SandboxId,
    connection,
    die,
    sdk_errors,
)
from aenv.output import Format, emit

__all__ = ["snapshot_app"]

#: The API waits up to its create timeout (120 s by default) for the node to capture the
#: guest; the SDK's 60 s default would give up first on a large guest under TCG.
CREATE_REQUEST_TIMEOUT_S = 300

snapshot_app = typer.Typer(
    help="Persistent snapshots: capture a running sandbox, start new ones from it.",
    no_args_is_help=True,
)


@snapshot_app.command("create")
def create(
    sandbox_id: SandboxId,
    name: Annotated[
        str | None,
        typer.Option(
            "--name",
            "-n",
            show_default=False,
            help="Snapshot name (a-z, 0-9, '.', '_', ':', '-'); taking a name again "
            "replaces that snapshot. Default: snap-<random>.",
        ),
    ] = None,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """Snapshot running SANDBOX_ID (memory, processes, files); print the snapshot's ID.

    The sandbox keeps running with its ID and timeout. Start copies of the snapshot with
    `aenv start SNAPSHOT_ID`. A paused sandbox cannot be snapshotted (exit 1).
    """
    from e2b import Sandbox

    opts = connection(api_url, api_key, data_dir).sdk_opts()
    opts["request_timeout"] = CREATE_REQUEST_TIMEOUT_S
    with sdk_errors(f"snapshot create {sandbox_id}", sandbox_id=sandbox_id):
        info = Sandbox.create_snapshot(sandbox_id, name=name, **opts)
    typer.echo(info.snapshot_id)


def _rows(sandbox_id: str | None, name: str | None, opts: Any) -> list[dict[str, Any]]:
    from e2b import Sandbox

    pages = Sandbox.list_snapshots(sandbox_id=sandbox_id, name=name, **opts)
    rows: list[dict[str, Any]] = []
    while pages.has_next:
        rows.extend(
            {"snapshot_id": s.snapshot_id, "names": list(s.names)} for s in pages.next_items()
        )
    return rows


@snapshot_app.command("ls")
def ls(
    output: Annotated[
        Format,
        typer.Option("--output", "-o", help="table on a terminal, json when piped; or force one."),
    ] = Format.auto,
    sandbox: Annotated[
        str | None,
        typer.Option(
            "--sandbox", "-s", show_default=False, help="Only snapshots taken of this sandbox."
        ),
    ] = None,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """List snapshots, newest first. JSON rows: snapshot_id, names (team-qualified)."""
    conn = connection(api_url, api_key, data_dir)
    with sdk_errors("snapshot ls"):
        rows = _rows(sandbox, None, conn.sdk_opts())
    human = lambda r: {**r, "names": ", ".join(r["names"])}  # noqa: E731
    emit(rows, ["snapshot_id", "names"], output, human=human)


@snapshot_app.command("fork")
def fork(
    snapshot: Annotated[str, typer.Argument(show_default=False, help="Snapshot ID (= name).")],
    count: Annotated[int, typer.Option("--count", "-n", min=1, help="How many children.")] = 1,
    timeout: Annotated[
        int | None,
        typer.Option("--timeout", "-t", min=1, help="Seconds each child lives (default 300)."),
    ] = None,
    metadata: Annotated[
        list[str] | None,
        typer.Option("--metadata", "-m", help="KEY=VALUE for every child (repeatable)."),
    ] = None,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """Fork SNAPSHOT into -n children spread over the nodes with room; print their IDs.

    One request (`POST /snapshots/{id}/fork`, docs/forks.md): each node fetches the
    snapshot once and maps its memory copy-on-write. Exit 1 if any child failed (the others
    are still printed).
    """
    from aenv.commands.common import call, pairs

    conn = connection(api_url, api_key, data_dir)
    body: dict[str, Any] = {"count": count, "timeout": timeout}
    if metadata:
        body["metadata"] = pairs(metadata, "--metadata")
    results = call(conn, "POST", f"/snapshots/{snapshot}/fork", body, timeout=600)
    failed = [r["error"] for r in results if "error" in r]
    for r in results:
        if "sandbox" in r:
            typer.echo(r["sandbox"]["sandboxID"])
    for e in failed:
        typer.echo(f"aenv: snapshot fork {snapshot}: a child failed: {e['message']}", err=True)
    if failed:
        raise typer.Exit(EXIT_FAILED)


@snapshot_app.command("rm")
def rm(
    snapshots: Annotated[
        list[str],
        typer.Argument(
            show_default=False, help="Snapshots to delete, by ID (= name) or team/name."
        ),
    ],
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """Delete snapshots; sandboxes already started from them run on.

    Only snapshots are deleted here (another template's name counts as unknown); exit 1 if
    one is unknown.
    """
    from e2b import Sandbox

    conn = connection(api_url, api_key, data_dir)
    missing = []
    for ref in snapshots:
        snapshot_id = ref.rsplit("/", 1)[-1]
        with sdk_errors(f"snapshot rm {ref}"):
            found = any(
                r["snapshot_id"] == snapshot_id for r in _rows(None, snapshot_id, conn.sdk_opts())
            )
            if not found or not Sandbox.delete_snapshot(snapshot_id, **conn.sdk_opts()):
                missing.append(ref)
    if missing:
        die(f"no such snapshot: {', '.join(missing)}", EXIT_FAILED)
