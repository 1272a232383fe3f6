"""`aenv auth`: remember an aenv API URL and key for later commands.

They go to `~/.config/aenv/credentials` (mode 0600). Flags and the AENV_*/E2B_* variables
still override the file, so one shell can point elsewhere without touching it.
"""

from __future__ import annotations

from typing import Annotated

import typer

from aenv.commands.common import EXIT_USAGE, die, sdk_errors
from aenv.config import credentials_path, write_credentials

__all__ = ["register"]


def auth(
    api_url: Annotated[
        str | None,
        typer.Option(
            "--api-url",
            show_default=False,
            help="aenv API URL, e.g. http://127.0.0.1:3000 (prompted if absent).",
        ),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            show_default=False,
            help="API key from `aenv up` or `aenv keys create` (prompted if absent, without echo).",
        ),
    ] = None,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify/--no-verify", help="Check URL and key against the server before saving."
        ),
    ] = True,
) -> None:
    """Save the API URL and key to ~/.config/aenv/credentials (mode 0600)."""
    import sys

    if (api_url is None or api_key is None) and not sys.stdin.isatty():
        die("--api-url and --api-key are required when stdin is not a terminal", EXIT_USAGE)
    url = (api_url or typer.prompt("aenv API URL")).rstrip("/")
    key = api_key or typer.prompt("API key", hide_input=True)
    if verify:
        from e2b import Sandbox

        with sdk_errors(f"auth {url}"):
            Sandbox.list(limit=1, api_url=url, api_key=key, sandbox_url=url).next_items()
    path = credentials_path()
    write_credentials(path, url, key)
    typer.echo(f"saved to {path}", err=True)


def register(app: typer.Typer) -> None:
    app.command()(auth)
