"""The sandbox-facing commands of `aenv` (issue 6), built on the e2b SDK; `register` adds
them to the CLI app so `aenv/cli.py` needs one line for all of them."""

from __future__ import annotations

import typer

from aenv.commands import auth, exec, sandboxes

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add auth, start, cn, exec, upload, download, ls, pause, resume, timeout, rm, fork."""
    auth.register(app)
    sandboxes.register(app)
    exec.register(app)
