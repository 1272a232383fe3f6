"""The embedded NATS's least-privilege users: a team's pipeline users and auditors
(`aenv keys pipeline create`), kept in `users.json` (0600) beside nats.conf, which is
rewritten from it and reloaded by nats-server on SIGHUP (no restart, no dropped clients).

Their permissions come from `bus.permissions`; the stack's own user keeps every right.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aenv.stack.secrets_file import write_private_file
from bus.permissions import auditor_permissions, pipeline_permissions
from bus.subjects import Names, pipeline_team

__all__ = [
    "PID_FILE",
    "NatsUser",
    "add_user",
    "load_users",
    "new_user",
    "reload",
    "remove_user",
    "render_config",
    "write_config",
]

USERS_FILE = "users.json"
PID_FILE = "nats.pid"
CONFIG_FILE = "nats.conf"
#: The stack's bus prefix, saved at start: permissions name the prefixed subjects.
PREFIX_FILE = "bus-prefix"


@dataclass(frozen=True)
class NatsUser:
    """One login: `team` set for a pipeline user, None for an auditor."""

    user: str
    password: str
    team: str | None

    @property
    def role(self) -> str:
        return "pipeline" if self.team is not None else "auditor"


def load_users(nats_dir: Path) -> list[NatsUser]:
    try:
        raw = json.loads((nats_dir / USERS_FILE).read_text())
    except (OSError, ValueError):
        return []
    return [NatsUser(u["user"], u["password"], u.get("team")) for u in raw.get("users", [])]


def _save(nats_dir: Path, users: list[NatsUser]) -> None:
    body = {"users": [{"user": u.user, "password": u.password, "team": u.team} for u in users]}
    write_private_file(nats_dir / USERS_FILE, json.dumps(body, indent=1))


def remove_user(nats_dir: Path, user: str) -> bool:
    """Drop a pipeline user or auditor (the config is not yet rewritten: `reload`);
    whether there was one."""
    users = load_users(nats_dir)
    kept = [u for u in users if u.user != user]
    _save(nats_dir, kept)
    return len(kept) < len(users)


def new_user(team: str | None) -> NatsUser:
    """A fresh login for a pipeline of `team` (None: an auditor): a name and a password."""
    if team is not None:
        pipeline_team(team)
    who = f"pipeline-{team}" if team is not None else "auditor"
    return NatsUser(f"{who}-{secrets.token_hex(3)}", secrets.token_hex(24), team)


def add_user(nats_dir: Path, team: str | None) -> NatsUser:
    """A new pipeline user of `team` (None: an auditor), saved; the config is not yet
    rewritten (`reload`)."""
    user = new_user(team)
    _save(nats_dir, [*load_users(nats_dir), user])
    return user


def _quoted(value: Any) -> str:
    return json.dumps(value)  # nats.conf takes JSON values; quoted, `$JS…` is no variable


def render_config(
    service_user: str, service_password: str, prefix: str, users: list[NatsUser]
) -> str:
    """nats.conf's authorization block: the stack's user with every right, then each
    pipeline user and auditor with its permissions."""
    names = Names(prefix)
    lines = [f"  {{user: {_quoted(service_user)}, password: {_quoted(service_password)}}}"]
    for u in users:
        perms = (
            pipeline_permissions(names, u.team)
            if u.team is not None
            else auditor_permissions(names)
        )
        lines.append(
            f"  {{user: {_quoted(u.user)}, password: {_quoted(u.password)}, "
            f"permissions: {_quoted(perms)}}}"
        )
    return "authorization {\n users: [\n" + ",\n".join(lines) + "\n ]\n}\n"


def write_config(
    nats_dir: Path, service_user: str, service_password: str, prefix: str | None = None
) -> Path:
    """nats.conf from the stack's user and the saved users; `prefix` saved for the next
    rewrite (None: the one saved at start)."""
    if prefix is None:
        try:
            prefix = (nats_dir / PREFIX_FILE).read_text().strip()
        except OSError:
            prefix = ""
    else:
        write_private_file(nats_dir / PREFIX_FILE, prefix + "\n")
    path = nats_dir / CONFIG_FILE
    write_private_file(
        path, render_config(service_user, service_password, prefix, load_users(nats_dir))
    )
    return path


def reload(nats_dir: Path) -> bool:
    """Ask the running nats-server (its pid file) to reread its config; whether it was
    running."""
    try:
        pid = int((nats_dir / PID_FILE).read_text().strip())
        os.kill(pid, signal.SIGHUP)
    except (OSError, ValueError):
        return False
    return True
