"""Operator commands of `aenv`, for the machine that runs the stack: they read and write its
event log (NATS) and read models (Postgres) directly, where the sandbox commands in
`aenv.commands` are clients of the public API only. Server packages (`bus`, `projections`,
`api.admin`) are imported inside the commands, so `aenv --help` stays fast."""

from __future__ import annotations

import typer

from aenv.ops.audit import audit
from aenv.ops.events import events
from aenv.ops.keys import keys_app
from aenv.ops.pipelinekeys import pipeline_app

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add `events`, `audit` and `keys create|ls|revoke` and `keys pipeline create|ls`."""
    app.command()(events)
    app.command()(audit)
    keys_app.add_typer(pipeline_app, name="pipeline")
    app.add_typer(keys_app, name="keys")
