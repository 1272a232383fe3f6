"""What every context kind shares: identity, the one-execution-at-a-time lock, the user its
process runs as, and the two jobs around an execution (per-request env vars, reseeding the
random state a snapshot restore duplicated).
"""

from __future__ import annotations

import asyncio
import os
import pwd
import socket
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RunAs:
    """The account a context's process runs as (E2B's sandboxes: `user`, home /home/user)."""

    name: str
    uid: int
    gid: int
    home: str

    @classmethod
    def lookup(cls, name: str | None) -> RunAs | None:
        """`name` when we are root and it exists; None = run as ourselves (tests, no user)."""
        if not name or os.geteuid() != 0:
            return None
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            return None
        return cls(pw.pw_name, pw.pw_uid, pw.pw_gid, pw.pw_dir)

    def popen_kwargs(self) -> dict[str, Any]:
        return {"user": self.uid, "group": self.gid, "extra_groups": []}


def base_env(runas: RunAs | None) -> dict[str, str]:
    """A clean environment for a context's process: never the server's own (its PYTHONPATH
    points at this package)."""
    home = runas.home if runas else os.environ.get("HOME", "/root")
    user = runas.name if runas else os.environ.get("USER", "root")
    return {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": home,
        "USER": user,
        "LOGNAME": user,
        "SHELL": "/bin/bash",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TERM": "xterm-256color",
    }


def valid_env(env: object) -> dict[str, str]:
    """A request's `env_vars`: a map of names to strings (None = none)."""
    if env is None:
        return {}
    if not isinstance(env, dict) or not all(
        isinstance(k, str)
        and k
        and "=" not in k
        and "\0" not in k
        and isinstance(v, str)
        and "\0" not in v
        for k, v in env.items()
    ):
        raise ValueError("env_vars must be a map of variable names to strings")
    return dict(env)


class Context(ABC):
    """One place code runs: a kernel (or shell) whose state persists between executions."""

    language: str

    def __init__(self, cwd: str, runas: RunAs | None, context_id: str | None = None) -> None:
        self.id = context_id or str(uuid.uuid4())
        self.cwd = cwd
        self.runas = runas
        self.lock = asyncio.Lock()  # one execution at a time, as a notebook kernel runs cells
        # The guest's hostname is the sandbox id (envd's /init sets it after it reseeded
        # the kernel's RNG). A context whose process state was captured under another name
        # — the template's, or a fork parent's — holds random state every other restore
        # of that capture holds too: it reseeds before its next execution there. A resume
        # of the same sandbox keeps the name, so a seeded sequence goes on across a pause.
        self._seeded_for = socket.gethostname()

    def describe(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    async def prepare(self) -> None:
        """Before an execution: reseed if this process now lives in another sandbox."""
        host = socket.gethostname()
        if host != self._seeded_for:
            await self.reseed()
            self._seeded_for = host

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def stop(self) -> None: ...

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    @abstractmethod
    def run(self, code: str, env: Mapping[str, str]) -> AsyncIterator[dict[str, Any]]:
        """Execute `code` with `env` set for its duration; yields E2B lines (`wire`)."""

    @abstractmethod
    def interrupt(self) -> None:
        """Stop the running execution (its client gave up); the context stays usable."""

    @abstractmethod
    async def reseed(self) -> None: ...
