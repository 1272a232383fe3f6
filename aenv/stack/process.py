"""A child server process: started, probed until ready, stopped politely then firmly."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import pwd
import random
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aenv.stack import portclaims

PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int, sig: int = signal.SIGTERM) -> Callable[[], None]:
    """For the child before exec: `sig` when the stack process goes, however it ends (a
    SIGKILLed `aenv serve` must not leave a postmaster holding its data dir). A parent that
    died before the prctl would never send it, hence the check after."""

    def arm() -> None:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return arm


def as_user(user: str | None) -> dict[str, Any]:
    """`subprocess` arguments that run a child as `user` with that user's group only:
    `user=` alone switches the uid and keeps root's groups (the server could read what
    root's group may, and could not enter a dir opened to its own group)."""
    if user is None:
        return {}
    return {"user": user, "group": pwd.getpwnam(user).pw_gid, "extra_groups": []}


class StackError(Exception):
    """An embedded service failed to start or stop."""


#: Ports this process handed out: two servers of one stack never get the same one.
_GIVEN: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


def free_ports_outside(ephemeral: tuple[int, int]) -> range:
    """Where to look for a listening port: below the kernel's ephemeral range (or above
    it when it starts too low)."""
    lo, hi = ephemeral
    return range(max(1024, lo - 12000), lo) if lo - 1024 >= 2000 else range(hi + 1, 65536)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now, outside the ephemeral range.

    Not "bind port 0": that port comes from the ephemeral range, which every outgoing
    connection draws from too. SeaweedFS's master, volume and filer dial each other while
    its S3 gateway still starts, and one of those dials took the gRPC port picked for the
    gateway (`bind: address already in use`, `aenv up` failed). Ports below the range are
    never handed out implicitly, so a port found free here stays free for its server.
    """
    return pick_port(free_ports_outside(_ephemeral_range()))


def pick_port(candidates: range, claims_dir: Path = portclaims.DEFAULT_DIR) -> int:
    """A port of `candidates` that binds now and that no process of this machine handed out
    in the last minutes (`aenv.stack.portclaims`)."""
    with portclaims.claims(claims_dir) as directory:
        for _ in range(200):
            port = random.choice(candidates)
            if port in _GIVEN:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            if directory is not None and portclaims.claimed(directory, port):
                continue
            _GIVEN.add(port)
            return port
    raise StackError(f"no free TCP port in {candidates.start}-{candidates.stop - 1}")


async def tcp_open(port: int) -> bool:
    try:
        _, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 1.0)
    except (OSError, TimeoutError):
        return False
    w.close()
    return True


class ManagedProcess:
    """One server process whose output goes to a log file under the data directory."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        log: Path,
        *,
        user: str | None = None,
        stop_signal: int = signal.SIGTERM,
    ) -> None:
        self.name = name
        self.argv = argv
        self.log = log
        self.user = user
        #: What asks it to stop quickly, also sent when the stack process dies.
        self.stop_signal = stop_signal
        self.proc: subprocess.Popen[bytes] | None = None
        #: Told each new pid (the supervisor's `ProcessBook`).
        self.on_start: Callable[[str, int], None] | None = None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, env: dict[str, str] | None = None) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            os.fchmod(out.fileno(), 0o600)  # servers may log secrets (a failed login's user)
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **as_user(self.user),
                preexec_fn=die_with_parent(os.getpid(), self.stop_signal),
                env={**os.environ, **(env or {})},
            )
        if self.on_start is not None:
            self.on_start(self.name, self.proc.pid)

    async def wait_ready(self, probe: Callable[[], Awaitable[bool]], timeout: float) -> None:
        """Poll `probe` until true; fail with the log tail if the process dies or time runs out."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is None or self.proc.poll() is not None:
                raise StackError(f"{self.name} exited during start-up:\n{self.tail()}")
            if await probe():
                return
            if time.monotonic() > deadline:
                raise StackError(f"{self.name} not ready after {timeout}s:\n{self.tail()}")
            await asyncio.sleep(0.1)

    async def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, self.stop_signal)
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(self.proc.wait, timeout)
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            await asyncio.to_thread(self.proc.wait)

    def tail(self, n: int = 2000) -> str:
        try:
            return self.log.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return "(no log)"
