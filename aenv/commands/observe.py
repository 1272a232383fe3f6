"""`aenv metrics ID` and `aenv logs ID [-f]`: a sandbox's resource samples and its log, as
E2B's CLI shows them (`e2b sandbox metrics|logs`), from the same API routes."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from aenv.commands.common import (
    DEFAULT_DATA,
    EXIT_FAILED,
    EXIT_SERVER,
    ApiKey,
    ApiUrl,
    DataDir,
    SandboxId,
    connection,
    die,
    die_refused,
)
from aenv.output import Format, emit

__all__ = ["register"]

#: how often `logs -f` asks for what is new
FOLLOW_EVERY_S = 2.0


def _get(
    api_url: str | None,
    api_key: str | None,
    data_dir: Any,
    path: str,
    params: dict[str, Any] | None = None,
) -> Any:
    import httpx

    conn = connection(api_url, api_key, data_dir)
    try:
        r = httpx.get(
            f"{conn.api_url}{path}", params=params, timeout=30, headers={"X-API-Key": conn.api_key}
        )
    except httpx.HTTPError as e:
        die(f"{path}: cannot reach {conn.api_url} ({type(e).__name__})", EXIT_SERVER)
    if r.status_code == 404:
        die(f"sandbox {path.split('/')[-2]} not found", EXIT_FAILED)
    if r.status_code >= 300:
        die_refused(path, r.status_code, r.text)
    return r.json()


def _human_metric(m: dict[str, Any]) -> dict[str, Any]:
    mib = 1 << 20
    return {
        "time": str(m["timestamp"]).replace("T", " ").removesuffix("Z"),
        "cpu": f"{m['cpuUsedPct']:.1f}% of {m['cpuCount']}",
        "memory": f"{m['memUsed'] // mib}/{m['memTotal'] // mib} MiB",
        "disk": f"{m['diskUsed'] // mib}/{m['diskTotal'] // mib} MiB",
    }


def metrics(
    sandbox_id: SandboxId,
    output: Annotated[Format, typer.Option("--output", "-o")] = Format.auto,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """SANDBOX_ID's CPU, memory and disk, sampled every few seconds while it runs."""
    samples = _get(api_url, api_key, data_dir, f"/sandboxes/{sandbox_id}/metrics")
    emit(samples, ["time", "cpu", "memory", "disk"], output, human=_human_metric)


def logs(
    sandbox_id: SandboxId,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines until Ctrl-C.")
    ] = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """SANDBOX_ID's log: what its guest's envd logged (processes started and ended, errors),
    one line each: time, level, message, fields."""
    seen = 0
    while True:
        doc = _get(
            api_url, api_key, data_dir, f"/v2/sandboxes/{sandbox_id}/logs", {"limit": 10_000}
        )
        entries = doc.get("logs", [])
        for e in entries[seen:]:
            fields = " ".join(f"{k}={v}" for k, v in (e.get("fields") or {}).items())
            typer.echo(
                f"{e['timestamp']} {e['level'].upper():5} {e['message']}"
                + (f" {fields}" if fields else "")
            )
        seen = max(seen, len(entries))
        if not follow:
            return
        time.sleep(FOLLOW_EVERY_S)


def register(app: typer.Typer) -> None:
    app.command()(metrics)
    app.command()(logs)
