"""`aenv node cordon|uncordon|drain ID`: take a node out of placement, and empty it by
pausing its sandboxes into the snapshot repository (an operator's key: `api/nodes.py`).

A drain is repeated steps of the API's (`POST /nodes/{id}/drain`, idempotent): each pauses
what runs on the node by then and says how many of its sandboxes are paused and durable;
the command prints that as it changes and exits 0 once all are — the node holds no running
sandbox and losing its disk loses none. Their resumes then land on other nodes.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from aenv.commands.common import (
    DEFAULT_DATA,
    EXIT_TIMED_OUT,
    ApiKey,
    ApiUrl,
    DataDir,
    api_call,
    die,
)

__all__ = ["describe", "node_app"]

#: how often a drain asks again while it waits for pauses and uploads
DRAIN_EVERY_S = 1.0

node_app = typer.Typer(
    help="Cordon, uncordon and drain nodes (an operator's key).", no_args_is_help=True
)
NodeId = Annotated[str, typer.Argument(help="The node's id (AENV_NODE_ID; `aenv status`).")]


def describe(p: dict[str, Any]) -> str:
    """One line of a drain's progress (the API's answer)."""
    line = f"node {p['nodeID']}: {p['durable']} of {p['sandboxes']} sandboxes paused and durable"
    if not p["done"]:
        line += f" ({p['running']} still running, {p['uploading']} uploading)"
    return line


@node_app.command()
def cordon(
    node_id: NodeId,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """NODE_ID takes no new sandboxes (its running ones go on); returns once it says so."""
    api_call(api_url, api_key, data_dir, "POST", f"/nodes/{node_id}/cordon", timeout=60)
    typer.echo(f"node {node_id} cordoned")


@node_app.command()
def uncordon(
    node_id: NodeId,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """NODE_ID takes new sandboxes again."""
    api_call(api_url, api_key, data_dir, "POST", f"/nodes/{node_id}/uncordon", timeout=60)
    typer.echo(f"node {node_id} uncordoned")


@node_app.command()
def drain(
    node_id: NodeId,
    timeout: Annotated[
        float, typer.Option(help="Seconds to wait for every sandbox to be paused and durable.")
    ] = 1800,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """Cordon NODE_ID, pause every sandbox it runs (memory kept) into the snapshot
    repository, drop its warm VMs; print progress and exit 0 once all its sandboxes are
    paused and durable (124 if --timeout passes first). The node stays cordoned."""
    deadline = time.monotonic() + timeout
    shown = ""
    while True:
        p = api_call(api_url, api_key, data_dir, "POST", f"/nodes/{node_id}/drain", timeout=60)
        line = describe(p)
        if line != shown:
            typer.echo(line)
            shown = line
        if p["done"]:
            typer.echo(f"node {node_id} drained")
            return
        if time.monotonic() > deadline:
            die(f"node {node_id} not drained within {timeout:.0f} s: {line}", EXIT_TIMED_OUT)
        time.sleep(DRAIN_EVERY_S)
