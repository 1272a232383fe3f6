"""The local stack `aenv up` started, as the operator commands (`keys`, `events`) see it:
they talk to its NATS and Postgres directly, so they need its `stack.json`, not an API key;
and the one place where their failures become exit codes."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from aenv.commands.common import EXIT_FAILED, EXIT_SERVER, debug_requested, die

__all__ = ["StackDir", "operator_errors", "pid_alive", "running_stack", "stack_info"]

StackDir = Annotated[
    Path,
    typer.Option(
        "--data-dir",
        help="State dir of the stack `aenv up` started: its stack.json "
        "says where its NATS and Postgres are.",
    ),
]


def pid_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped, does not)."""
    from aenv.stack.records import start_time  # the server's package: only when it runs

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return start_time(pid) is not None


def stack_info(data_dir: Path) -> dict[str, object] | None:
    """`stack.json` of the stack under `data_dir`, or None if none runs there (a file left
    by a stack that died does not count)."""
    try:
        info: dict[str, object] = json.loads((data_dir / "stack.json").read_text())
    except (OSError, ValueError):
        return None
    pid = info.get("pid")
    return info if isinstance(pid, int) and pid_alive(pid) else None


def running_stack(data_dir: Path) -> dict[str, object]:
    """Where the operator commands find NATS and Postgres: the `stack.json` of the stack
    `aenv up` started under `data_dir`, else — a machine of a fleet, whose roles run under
    systemd or Kubernetes — `AENV_NATS_URL` and `AENV_DATABASE_URL` from the environment
    (the roles' env file). Exits 3 with a hint when there is neither."""
    info = stack_info(data_dir)
    if info is not None:
        return info
    nats_url, db_url = os.environ.get("AENV_NATS_URL"), os.environ.get("AENV_DATABASE_URL")
    if nats_url and db_url:
        return {"nats_url": nats_url, "database_url": db_url}
    die(
        f"aenv is not running under {data_dir} (aenv up), and AENV_NATS_URL and "
        "AENV_DATABASE_URL do not say where a fleet's servers are",
        EXIT_SERVER,
    )


@contextmanager
def operator_errors(what: str) -> Iterator[None]:
    """Domain refusals exit 1 (unknown key), NATS/Postgres failures exit 3; one line each."""
    from nats.errors import NoServersError

    from domain.errors import DomainError

    try:
        yield
    except (typer.Exit, typer.Abort, KeyboardInterrupt):
        raise
    except Exception as e:
        if debug_requested():
            raise
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if isinstance(e, DomainError):  # NotFound above all: an unknown key
            die(f"{what}: {text}", EXIT_FAILED)
        if isinstance(e, NoServersError | OSError):
            die(f"{what}: cannot reach the stack's NATS or Postgres ({text})", EXIT_SERVER)
        die(f"{what}: {type(e).__name__}: {text}", EXIT_SERVER)
