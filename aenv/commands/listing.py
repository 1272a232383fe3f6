"""What the CLI shows of sandboxes: `aenv ls` and `aenv info` (E2B's `sandbox list|info`),
and the time a sandbox has left, the one reckoning `ls`, `info` and `timeout` share.

A running sandbox has until its `endAt`. A paused one's clock stands still (paused time does
not consume its TTL): what it has is what it kept, the seconds it runs once resumed
(`remainingS`) — its `endAt`, the end it had when paused, would show a paused sandbox as
long expired (`EXPIRES IN -19m08s`).
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from aenv.commands.common import (
    DEFAULT_DATA,
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
from aenv.output import Format, emit, wants_json

__all__ = ["left_s", "register", "row"]

STATES = ("running", "paused")
#: secrets a detail carries that `info` never prints
_SECRETS = ("envdAccessToken", "trafficAccessToken")


def _at(wire: str | None) -> str | None:
    return None if wire is None else datetime.fromisoformat(wire).isoformat()


def row(wire: dict[str, Any]) -> dict[str, Any]:
    """A listed sandbox (the API's JSON) as the CLI's JSON row."""
    return {
        "sandbox_id": wire["sandboxID"],
        "template": wire.get("alias") or wire["templateID"],
        "template_id": wire["templateID"],
        "state": wire["state"],
        "started_at": _at(wire["startedAt"]),
        "end_at": _at(wire["endAt"]),
        "cpu_count": wire["cpuCount"],
        "memory_mb": wire["memoryMB"],
        "metadata": wire.get("metadata") or {},
        "paused_at": _at(wire.get("pausedAt")),
        "remaining_s": wire.get("remainingS"),
    }


def left_s(r: dict[str, Any], now: datetime) -> float:
    """Seconds a sandbox (a `row`) has left: to its end while it runs, what it kept while
    it is paused."""
    if r["state"] == "paused" and r["remaining_s"] is not None:
        return float(r["remaining_s"])
    return (datetime.fromisoformat(r["end_at"]) - now).total_seconds()


def _span(seconds: float) -> str:
    s = int(abs(seconds))
    text = f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
    return text if seconds >= 0 else f"-{text}"


def human(r: dict[str, Any], now: datetime | None = None) -> dict[str, Any]:
    """Table form of a row: how long ago it started and how long it has left, a paused
    sandbox's marked as kept while paused."""
    now = now or datetime.now(UTC)
    left = _span(left_s(r, now))
    return {
        **r,
        "age": _span((now - datetime.fromisoformat(r["started_at"])).total_seconds()),
        "expires_in": f"{left} (paused)" if r["state"] == "paused" else left,
    }


def ls(
    output: Annotated[
        Format,
        typer.Option("--output", "-o", help="table on a terminal, json when piped; or force one."),
    ] = Format.auto,
    state: Annotated[
        list[str] | None,
        typer.Option(
            "--state", "-s", help="Only sandboxes in this state (running, paused), repeatable."
        ),
    ] = None,
    metadata: Annotated[
        list[str] | None,
        typer.Option(
            "--metadata", "-m", help="Only sandboxes with this KEY=VALUE metadata, repeatable."
        ),
    ] = None,
    node: Annotated[
        str | None, typer.Option("--node", help="Only sandboxes on this node (its id).")
    ] = None,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """List running and paused sandboxes. EXPIRES IN is the time left: a paused sandbox's
    clock stands still, it shows what the sandbox runs once resumed."""
    from aenv.commands.sandbox_api import listing

    if bad := [s for s in state or () if s not in STATES]:
        die(f"--state must be one of: {', '.join(STATES)}, not {bad[0]!r}", EXIT_USAGE)
    conn = connection(api_url, api_key, data_dir)
    with sdk_errors("ls"):
        rows = [
            row(w)
            for w in listing(conn, states=state or (), metadata=pairs(metadata, "--metadata"))
            if node is None or w.get("nodeID") == node
        ]
    rows.sort(key=lambda r: str(r["started_at"]))
    columns = ["sandbox_id", "template", "state", "age", "expires_in", "metadata"]
    emit(rows, columns, output, human=human)


def details(wire: dict[str, Any]) -> dict[str, Any]:
    """`aenv info`'s JSON: the listing's row and what only the detail has (disk, node,
    lifecycle, network, fork parent, envd version); never the access tokens."""
    extra = {k: v for k, v in wire.items() if k not in _SECRETS}
    return {
        **row(extra),
        "disk_mb": extra.get("diskSizeMB"),
        "envd_version": extra.get("envdVersion"),
        "node_id": extra.get("nodeID"),
        "forked_from": extra.get("forkedFrom"),
        "lifecycle": extra.get("lifecycle"),
        "allow_internet_access": extra.get("allowInternetAccess"),
        "network": extra.get("network"),
    }


def _pairs_of(d: dict[str, Any], now: datetime) -> list[dict[str, Any]]:
    h = human(d, now)
    shown = {
        "sandbox": d["sandbox_id"],
        "template": f"{d['template']} ({d['template_id']})",
        "state": d["state"],
        "started": f"{d['started_at']} ({h['age']} ago)",
        "ends": (
            f"paused at {d['paused_at']}; kept {_span(left_s(d, now))}: runs that long once resumed"
            if d["state"] == "paused"
            else f"{d['end_at']} (in {h['expires_in']})"
        ),
        "cpu": d["cpu_count"],
        "memory": f"{d['memory_mb']} MiB",
        "disk": f"{d['disk_mb']} MiB" if d["disk_mb"] is not None else None,
        "metadata": d["metadata"],
        "node": d["node_id"],
        "forked from": d["forked_from"],
        "lifecycle": d["lifecycle"],
        "network": d["network"],
        "envd": d["envd_version"],
    }
    return [{"field": k, "value": v} for k, v in shown.items() if v is not None]


def info(
    sandbox_id: SandboxId,
    output: Annotated[
        Format,
        typer.Option("--output", "-o", help="table on a terminal, json when piped; or force one."),
    ] = Format.auto,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """SANDBOX_ID's template, state, start and end (a paused one: the time it kept),
    CPU/memory/disk, metadata, node, lifecycle and network (E2B's `sandbox info`)."""
    from aenv.commands.sandbox_api import detail

    conn = connection(api_url, api_key, data_dir)
    with sdk_errors(f"info {sandbox_id}", sandbox_id=sandbox_id):
        d = details(detail(sandbox_id, conn))
    if wants_json(output):
        sys.stdout.write(json.dumps(d, indent=2) + "\n")
        return
    emit(_pairs_of(d, datetime.now(UTC)), ["field", "value"], output)


def register(app: typer.Typer) -> None:
    app.command()(ls)
    app.command()(info)
