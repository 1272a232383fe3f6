"""What both roles read at start: where the services are, and how to tell the supervisor."""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from pathlib import Path
from typing import Literal

from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from aenv.logformat import progress

#: Last line a role prints once it serves; the supervisor waits for it.
READY = "ROLE-READY"


class RoleSettings(BaseSettings):
    """Set by the supervisor (or by an operator running a role on its own)."""

    model_config = SettingsConfigDict(env_prefix="AENV_", frozen=True, extra="ignore")

    data_dir: Path = Path("/var/lib/aenv")
    host: str = "127.0.0.1"
    port: int = 3000
    nats_url: str = "nats://127.0.0.1:4222"
    database_url: str = "postgresql+asyncpg://postgres@127.0.0.1:5432/aenv"
    s3_endpoint: str | None = None
    s3_access_key: str | None = None
    s3_secret_key: str | None = None
    s3_bucket: str = "aenv-snapshots"
    #: The snapshot repository as a directory (a filesystem every node mounts), used when no
    #: S3 endpoint is set (`workers/snapshot/posix.py`).
    snapshot_dir: Path | None = None
    #: Template builds one API process runs at once (each drives a build sandbox).
    build_parallel: int = 2
    #: After SIGTERM (`aenv down`, or the supervisor's death), the role drains this long at
    #: most, then exits anyway: a drain that waits on a server which died with the
    #: supervisor must not hang for ever (holding VMs, the port, Postgres's clients).
    drain_s: float = 30.0
    #: What a node role does on SIGTERM before it stops (`workers.node.stopdrain`): `off`
    #: (its VMs die with it: `aenv up`, tests) or `pause` (cordon itself, pause every
    #: sandbox into the repository and wait until each is durable: the systemd unit and
    #: the DaemonSet, whose stop grace must exceed `stop_drain_s`).
    stop_drain: Literal["off", "pause"] = "off"
    #: How long that drain may take at most; then the role stops anyway.
    stop_drain_s: float = 300.0
    #: An API key every API process registers at start (idempotently): a fleet's first
    #: key, given by its operator (a Kubernetes Secret, an EnvironmentFile). Unset: the
    #: API mints one once and keeps it in `<data_dir>/api-key` (one machine).
    api_key: SecretStr | None = None
    #: The key that signs build-context upload links. Every API process of a fleet must
    #: share it (a link one hands out is PUT to another). Unset: one kept in the data dir.
    upload_secret: SecretStr | None = None


#: whether this process said READY: a start cut short before it may be tried again
_said_ready = False


def said_ready() -> bool:
    return _said_ready


def say(msg: str) -> None:
    """A progress line on stdout, as a JSON record of `aenv.progress` (the supervisor relays
    it to the stack's log, `aenv up` shows it). A role whose supervisor died writes into a
    pipe nobody reads: the line is dropped, not raised — a BrokenPipeError in the SIGTERM
    handler left the role never stopping."""
    global _said_ready
    _said_ready = _said_ready or msg == READY
    try:
        print(progress(msg), flush=True)
    except (BrokenPipeError, ValueError):  # ValueError: stdout already swapped and closed
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the process's life)


def write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, stat.S_IRUSR | stat.S_IWUSR)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), stat.S_IRUSR | stat.S_IWUSR)  # also when it existed, older
        f.write(text)
