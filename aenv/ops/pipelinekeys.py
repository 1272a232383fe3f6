"""`aenv keys pipeline create|ls`: NATS logins for pipelines and auditors (issue 32).

A team's pipeline user may send commands only through its team's ingress and read only
its team's stripped events; an auditor reads every team's stripped events and sends
nothing (`bus.permissions`, docs/pipelines.md). With the embedded NATS of `aenv up` the
user is added to its config and the server reloads it at once (SIGHUP); with a NATS of
your own, the command prints the user's permissions for your server's config.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from aenv.config import DEFAULT_DATA_DIR
from aenv.ops.stack import StackDir, operator_errors, running_stack

__all__ = ["pipeline_app"]

pipeline_app = typer.Typer(
    help="NATS logins for pipelines (one team) and auditors (read-only, no secrets).",
    no_args_is_help=True,
)


def _nats_dir(data_dir: Path) -> Path:
    return data_dir / "services" / "nats"


async def _streams(nats_url: str, team: str | None) -> dict[str, str]:
    """The streams the user reads, made now if missing (the team's fills from the feed)."""
    from bus import Bus, BusSettings
    from bus.teamfeed import ensure_team_stream

    bus = await Bus.connect(BusSettings(nats_url=nats_url), setup=False, retry=False)
    try:
        names = bus.names
        if team is None:
            return {"stream": names.feed_stream, "inbox_prefix": names.inbox(None)}
        stream = await ensure_team_stream(bus.js, names, team, bus.settings.replicas)
        return {
            "stream": stream,
            "ingress": names.team_ingress(team),
            "inbox_prefix": names.inbox(team),
        }
    finally:
        await bus.close()


def _servers(nats_url: str) -> str:
    """The stack's NATS URLs without the stack user's login in them."""
    from urllib.parse import urlsplit

    out = []
    for url in nats_url.split(","):
        parts = urlsplit(url.strip())
        out.append(f"{parts.scheme}://{parts.hostname}:{parts.port or 4222}")
    return ",".join(out)


@pipeline_app.command("create")
def create(
    team: Annotated[
        str | None, typer.Option(help="The team whose commands and events it may use.")
    ] = None,
    auditor: Annotated[
        bool, typer.Option("--auditor", help="An auditor instead: reads every team's log.")
    ] = False,
    data_dir: StackDir = DEFAULT_DATA_DIR,
) -> None:
    """Issue a NATS login and print it (JSON: user, password, team, prefix, stream, …).

    The password is shown once. With `aenv up`'s embedded NATS it works as soon as this
    returns; with your own NATS, add the printed `permissions` to its config and reload it.
    """
    import asyncio

    from aenv.stack.natsusers import add_user, new_user, reload, write_config
    from aenv.stack.secrets_file import load_or_mint
    from bus import BusSettings
    from bus.permissions import auditor_permissions, pipeline_permissions
    from bus.subjects import Names, pipeline_team

    if auditor == (team is not None):
        raise typer.BadParameter("give --team T, or --auditor")
    with operator_errors("keys pipeline create"):
        if team is not None:
            pipeline_team(team)
        info = running_stack(data_dir)
        out: dict[str, Any] = asyncio.run(_streams(str(info["nats_url"]), team))
        prefix = BusSettings().bus_prefix
        out |= {"team": team, "prefix": prefix, "servers": _servers(str(info["nats_url"]))}
        nats_dir = _nats_dir(data_dir)
        if (nats_dir / "credentials.json").exists():  # the embedded NATS of `aenv up`
            user = add_user(nats_dir, team)
            password = load_or_mint(nats_dir / "credentials.json", ("password",))["password"]
            write_config(nats_dir, "aenv", password)
            out["reloaded"] = reload(nats_dir)
        else:
            user = new_user(team)
            names = Names(prefix)
            perms = pipeline_permissions(names, team) if team else auditor_permissions(names)
            out["permissions"] = perms
            out["note"] = "add this user and password with these permissions to your NATS config"
        out |= {"user": user.user, "password": user.password, "role": user.role}
    typer.echo(json.dumps(out, indent=2))


@pipeline_app.command("revoke")
def revoke(
    user: Annotated[str, typer.Argument(help="The login's user name (`aenv keys pipeline ls`).")],
    data_dir: StackDir = DEFAULT_DATA_DIR,
) -> None:
    """Remove a pipeline user or auditor from the embedded NATS: its connections are
    closed by the reload and it cannot log in again. An unknown USER exits 1."""
    from aenv.commands.common import die
    from aenv.stack.natsusers import reload, remove_user, write_config
    from aenv.stack.secrets_file import load_or_mint

    nats_dir = _nats_dir(data_dir)
    if not (nats_dir / "credentials.json").exists():
        die(f"no embedded NATS under {data_dir}: remove {user} from your NATS config", 1)
    if not remove_user(nats_dir, user):
        die(f"no pipeline user or auditor {user}", 1)
    password = load_or_mint(nats_dir / "credentials.json", ("password",))["password"]
    write_config(nats_dir, "aenv", password)
    typer.echo(json.dumps({"revoked": user, "reloaded": reload(nats_dir)}))


@pipeline_app.command("ls")
def ls(data_dir: StackDir = DEFAULT_DATA_DIR) -> None:
    """The pipeline users and auditors of the embedded NATS (JSON rows, no passwords)."""
    from aenv.stack.natsusers import load_users

    rows = [
        {"user": u.user, "role": u.role, "team": u.team} for u in load_users(_nats_dir(data_dir))
    ]
    typer.echo(json.dumps(rows, indent=2))
