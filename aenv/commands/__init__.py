"""The sandbox-facing commands of `aenv` (issue 6), built on the e2b SDK; `register` adds
them to the CLI app so `aenv/cli.py` needs one line for all of them."""

from __future__ import annotations

import typer

from aenv.commands import auth, exec, listing, observe, sandboxes, templates
from aenv.commands.leases import lease_app
from aenv.commands.nodes import node_app
from aenv.commands.snapshots import snapshot_app
from aenv.commands.volumes import volume_app

__all__ = ["EPILOG", "register"]

EPILOG = (
    "Sandbox commands find the server from --api-url/--api-key, else AENV_API_URL/"
    "AENV_API_KEY, else E2B_API_URL/E2B_API_KEY, else `aenv auth`'s credentials, else the "
    "local stack in --data-dir.\n\n"
    "Exit codes: 0 ok, 1 the command failed in the sandbox (exec mirrors its code) or what "
    "it names does not exist, "
    "2 usage, 3 server or network error, 124 `exec -t` timed out. `aenv --debug COMMAND` "
    "shows tracebacks. "
    "Reference: docs/cli.md."
)


def register(app: typer.Typer) -> None:
    """Add auth, start, cn, exec, upload, download, ls, pause, resume, timeout, rm, fork,
    snapshot, volume, node cordon|uncordon|drain, lease create|renew|ls|rm, build, pull,
    template ls|rm, and the top-level help's epilog on configuration and exit codes."""
    auth.register(app)
    sandboxes.register(app)
    listing.register(app)
    exec.register(app)
    observe.register(app)
    app.add_typer(snapshot_app, name="snapshot")
    app.add_typer(volume_app, name="volume")
    app.add_typer(node_app, name="node")
    app.add_typer(lease_app, name="lease")
    templates.register(app)
    if not app.info.epilog:
        app.info.epilog = EPILOG
