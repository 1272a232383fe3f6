"""The supervisor's view of a role process: start it, relay its progress, know when it is
ready, restart it when it dies, stop it politely then firmly."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import signal
import sys
import time
from collections.abc import Callable

from aenv.roles.common import READY

PR_SET_PDEATHSIG = 1
#: More crashes than this within `CRASH_WINDOW_S` and the supervisor gives up (a role that
#: cannot start — a port taken, a broken image — would otherwise restart forever).
MAX_CRASHES = 5
CRASH_WINDOW_S = 60.0


def _die_with_parent() -> None:
    """A SIGKILLed supervisor must not leave a role running (it holds VMs or the port)."""
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class RoleFailed(Exception):
    """A role process ended during start-up or crashed too often."""


class RoleProcess:
    def __init__(self, role: str, env: dict[str, str], say: Callable[[str], None]) -> None:
        self.role = role
        self.env = env
        self.say = say
        self.proc: asyncio.subprocess.Process | None = None
        self.ready = asyncio.Event()
        self._relay: asyncio.Task[None] | None = None
        self._crashes: list[float] = []

    async def start(self) -> None:
        self.ready.clear()
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "aenv.serve", self.role,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            env=self.env, preexec_fn=_die_with_parent,
        )  # fmt: skip
        self._relay = asyncio.create_task(self._relay_lines(self.proc))

    async def _relay_lines(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            if line == READY:
                self.ready.set()
            else:
                self.say(line)

    async def wait_ready(self) -> None:
        """Until the role says it serves; RoleFailed if it exits first."""
        assert self.proc is not None
        exited = asyncio.create_task(self.proc.wait())
        ready = asyncio.create_task(self.ready.wait())
        try:
            await asyncio.wait({exited, ready}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (exited, ready):
                t.cancel()
        if not self.ready.is_set():
            raise RoleFailed(f"{self.role} exited during start-up (code {self.proc.returncode})")

    async def wait_exit(self) -> int:
        assert self.proc is not None
        rc = await self.proc.wait()
        if self._relay is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._relay, 1.0)
        return rc

    async def restart_after_crash(self, rc: int) -> None:
        now = time.monotonic()
        self._crashes = [t for t in self._crashes if now - t < CRASH_WINDOW_S] + [now]
        if len(self._crashes) > MAX_CRASHES:
            raise RoleFailed(f"{self.role} crashed {len(self._crashes)} times in "
                             f"{CRASH_WINDOW_S:.0f}s (last code {rc}); giving up")  # fmt: skip
        self.say(f"{self.role} exited unexpectedly (code {rc}); restarting it")
        await asyncio.sleep(min(0.5 * len(self._crashes), 5.0))
        await self.start()
        await self.wait_ready()
        self.say(f"{self.role} is back")

    async def stop(self, timeout: float = 60.0) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            self.say(f"{self.role} did not stop within {timeout:.0f}s; killing it")
            proc.kill()
            await proc.wait()
