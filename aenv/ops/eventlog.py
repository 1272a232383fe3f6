"""`aenv log backup|restore`: the event log to files and back (`bus.backup`, docs/deploy.md);
`aenv log limits show|set`: the streams' limits, which only this changes (`bus.setup`).

The event log is the one thing of a fleet that cannot be rebuilt from anything else:
read models refold from it (`aenv projections rebuild`), nodes write their heartbeats and
routes again, captures live in the snapshot repository. These two commands are the
procedure an operator runs (and a test performs): a backup of every message with its
subject, headers and sequence, checked by a manifest of checksums; a restore into a fresh
NATS, which refuses a log that is not empty unless forced.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from aenv.commands.common import EXIT_FAILED, EXIT_SERVER, die
from aenv.config import DEFAULT_DATA_DIR
from aenv.ops.stack import StackDir, operator_errors, stack_info

__all__ = ["log_app"]

log_app = typer.Typer(
    help="Back up the event log (AENV_EVT) to files, or restore it into a fresh NATS.",
    no_args_is_help=True,
)

NatsUrl = Annotated[
    str | None,
    typer.Option(
        "--nats-url",
        help="NATS to read or write (default: the stack under --data-dir, else AENV_NATS_URL). "
        "The bus prefix and replicas come from AENV_BUS_PREFIX and AENV_REPLICAS.",
    ),
]


def _nats_url(given: str | None, data_dir: Path) -> str:
    if given:
        return given
    info = stack_info(data_dir)
    if info is not None:
        return str(info["nats_url"])
    if url := os.environ.get("AENV_NATS_URL"):
        return url
    die(f"no stack under {data_dir} and no AENV_NATS_URL: say --nats-url", EXIT_SERVER)


def _run(what: str, nats_url: str, job: str, directory: Path, force: bool = False) -> None:
    import asyncio

    from bus import Bus, BusSettings
    from bus.backup import BackupError, backup_log, restore_log

    async def run() -> dict[str, object]:
        settings = BusSettings(nats_url=nats_url)
        bus = await Bus.connect(settings, setup=False, retry=False)
        try:
            if job == "backup":
                manifest = await backup_log(bus.js, settings, directory)
            else:
                manifest = await restore_log(bus.js, settings, directory, force=force)
                # and the rest of aenv's streams and buckets, as a role's start makes them
                from bus.setup import ensure_streams

                await ensure_streams(bus.js, settings)
        finally:
            await bus.close()
        return {
            "stream": manifest.stream,
            "messages": manifest.messages,
            "first_seq": manifest.first_seq,
            "last_seq": manifest.last_seq,
            "files": len(manifest.files),
            "directory": str(directory),
        }

    with operator_errors(what):
        try:
            summary = asyncio.run(run())
        except BackupError as e:
            die(f"{what}: {e}", EXIT_FAILED)
    typer.echo(json.dumps(summary))


@log_app.command("backup")
def backup(
    out: Annotated[Path, typer.Option("--out", help="A new or empty directory.")],
    nats_url: NatsUrl = None,
    data_dir: StackDir = DEFAULT_DATA_DIR,
) -> None:
    """Write every message of the event log (subject, headers, time, sequence, in order)
    to OUT with a manifest of counts and SHA-256 checksums. Safe on a live stack: it takes
    the log up to its last sequence when it starts."""
    _run("log backup", _nats_url(nats_url, data_dir), "backup", out)


@log_app.command("restore")
def restore(
    directory: Annotated[Path, typer.Argument(help="A directory `aenv log backup` wrote.")],
    force: Annotated[
        bool, typer.Option("--force", help="Replace an event log that is not empty.")
    ] = False,
    nats_url: NatsUrl = None,
    data_dir: StackDir = DEFAULT_DATA_DIR,
) -> None:
    """Check the backup's checksums, then publish it into this NATS's event log with the
    same sequences, and create aenv's other streams and buckets. Refuses a log that is not
    empty (--force replaces it). Then: start the roles on an empty database (the
    projections fold the log) or run `aenv projections rebuild`."""
    _run("log restore", _nats_url(nats_url, data_dir), "restore", directory, force)


limits_app = typer.Typer(
    help="The streams' limits (AENV_EVENT_MAX_BYTES, AENV_EVENT_MAX_MSGS, "
    "AENV_COMMAND_MAX_MSGS): shown, or changed for the whole fleet.",
    no_args_is_help=True,
)
log_app.add_typer(limits_app, name="limits")

Limit = Annotated[int | None, typer.Option(min=0, help="0: none; not given: kept as it is.")]


def _limits(nats_url: str, values: dict[str, int] | None) -> None:
    import asyncio

    from bus import Bus, BusSettings
    from bus.setup import limits_of, set_limits, stream_limits

    async def run() -> dict[str, dict[str, int]]:
        settings = BusSettings(nats_url=nats_url)
        bus = await Bus.connect(settings, setup=False, retry=False)
        try:
            if values is not None:
                return await set_limits(bus.js, settings, values)
            return {
                stream: limits_of((await bus.js.stream_info(stream)).config, lims)
                for stream, lims in stream_limits(bus.names).items()
            }
        finally:
            await bus.close()

    with operator_errors("log limits"):
        typer.echo(json.dumps(asyncio.run(run())))


@limits_app.command("show")
def limits_show(nats_url: NatsUrl = None, data_dir: StackDir = DEFAULT_DATA_DIR) -> None:
    """Each stream's limits, as the settings say them (0: none)."""
    _limits(_nats_url(nats_url, data_dir), None)


@limits_app.command("set")
def limits_set(
    event_max_bytes: Limit = None,
    event_max_msgs: Limit = None,
    command_max_msgs: Limit = None,
    nats_url: NatsUrl = None,
    data_dir: StackDir = DEFAULT_DATA_DIR,
) -> None:
    """Change the streams' limits for the whole fleet — a role start never does: one whose
    AENV_EVENT_MAX_BYTES, AENV_EVENT_MAX_MSGS or AENV_COMMAND_MAX_MSGS differ from the
    streams' refuses to start. Then set the same values in every role's environment. NATS
    refuses a byte limit its store cannot reserve."""
    given = {
        "AENV_EVENT_MAX_BYTES": event_max_bytes,
        "AENV_EVENT_MAX_MSGS": event_max_msgs,
        "AENV_COMMAND_MAX_MSGS": command_max_msgs,
    }
    values = {k: v for k, v in given.items() if v is not None}
    if not values:
        die("log limits set: say at least one of the limits (see --help)", EXIT_FAILED)
    _limits(_nats_url(nats_url, data_dir), values)
