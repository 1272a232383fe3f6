"""The supervisor's view of a role process: start it, relay its output, know when it is
ready, restart it when it dies (for ever, with capped backoff: `aenv.backoff`), stop it
politely then firmly.

Both of a role's output streams come through here, line by line, into the supervisor's
stdout (the stack's log): its JSON records as they are, anything else — a traceback the
interpreter printed, a library's print — wrapped into a record naming the role
(`aenv.logs.wrap`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from typing import TypeVar

from aenv.backoff import CAP_S, CrashRecord
from aenv.logformat import marks, wrap
from aenv.roles.common import READY
from aenv.stack.process import die_with_parent

T = TypeVar("T")


class RoleFailed(Exception):
    """A role process ended during the stack's start-up."""


class RoleProcess:
    def __init__(
        self,
        role: str,
        env: dict[str, str],
        say: Callable[[str], None],
        *,
        restart_cap_s: float = CAP_S,
        stop_timeout_s: float = 60.0,
        on_start: Callable[[str, int], None] | None = None,
    ) -> None:
        self.role = role
        self.env = env
        self.say = say
        self.proc: asyncio.subprocess.Process | None = None
        self.ready = asyncio.Event()
        self._relays: list[asyncio.Task[None]] = []
        self.crashes = CrashRecord(cap_s=restart_cap_s)
        #: "starting", "ready" or "restarting" — what `aenv status` shows.
        self.state = "starting"
        self.last_exit: int | None = None
        #: Longer than the role's own drain deadline (`RoleSettings.drain_s`).
        self.stop_timeout_s = stop_timeout_s
        self.on_start = on_start

    def status(self) -> dict[str, object]:
        return {
            "state": self.state,
            "pid": self.proc.pid if self.proc else None,
            "restarts": self.crashes.total,
            "last_exit": self.last_exit,
        }

    async def start(self) -> None:
        self.ready.clear()
        self.state = "starting"
        self.crashes.started(time.monotonic())
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "aenv.serve",
            self.role,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
            preexec_fn=die_with_parent(os.getpid()),
            limit=1 << 20,
        )
        # A SIGKILLed supervisor SIGTERMs the role (PDEATHSIG), which then drains within
        # its deadline; the record lets `aenv down`/`up` find it should it not.
        if self.on_start is not None:
            self.on_start(self.role, self.proc.pid)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._relays = [
            asyncio.create_task(self._relay_lines(self.proc.stdout, "stdout")),
            asyncio.create_task(self._relay_lines(self.proc.stderr, "stderr")),
        ]

    async def _relay_lines(self, stream: asyncio.StreamReader, name: str) -> None:
        service = f"aenv-{self.role}"
        while True:
            try:
                raw = await stream.readline()
            except ValueError:  # a line past the reader's limit (1 MiB): dropped
                continue
            if not raw:
                return
            line = raw.decode(errors="replace").rstrip("\n")
            if not line.strip():
                continue
            if marks(line, READY):
                self.ready.set()
            else:
                _emit(wrap(line, service=service, stream=name))

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
        self.state = "ready"

    async def wait_exit(self) -> int:
        assert self.proc is not None
        rc = await self.proc.wait()
        for relay in self._relays:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(relay, 1.0)
        return rc

    async def supervise(self, stop: asyncio.Event, changed: Callable[[], object]) -> None:
        """Until `stop`: restart the role whenever it exits, however often. Never raises:
        one role's crash loop must not take the other (and its VMs) down with it."""
        while not stop.is_set():
            rc = await _unless_stopped(self.wait_exit(), stop)
            if rc is None:
                return
            self.last_exit = rc
            delay = self.crashes.crashed(time.monotonic())
            self.state = "restarting"
            changed()
            self.say(
                f"{self.role} exited unexpectedly (code {rc}, {self.crashes.streak} in a "
                f"row); restarting it in {delay:.1f}s"
            )
            if await _unless_stopped(asyncio.sleep(delay, True), stop) is None:
                return
            await self.start()
            changed()
            try:
                await self.wait_ready()
            except RoleFailed as e:
                self.say(str(e))
                continue  # its exit is seen at the top of the loop
            self.say(f"{self.role} is back")
            changed()

    async def stop(self) -> None:
        timeout = self.stop_timeout_s
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


def _emit(line: str) -> None:
    """A role's line on the supervisor's stdout (the stack's log)."""
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


async def _unless_stopped(work: Coroutine[object, object, T], stop: asyncio.Event) -> T | None:
    """`work`'s result, or None once `stop` is set first (`work` is then cancelled)."""
    task = asyncio.ensure_future(work)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if stop.is_set() and not task.done():
        task.cancel()
        return None
    return task.result()
