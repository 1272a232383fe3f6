"""The node's block service (issue 29) as a supervised child process: started when lazy
images are on, adopted when a previous node process left one running, restarted when it
dies, and stopped with the node only when no VM reads through it.

It knows a command line, a socket and a pid file, nothing of what the service serves (the
service is the snapshot worker's package: `aenv.roles.blocks`, which the node never
imports). Why a process of its own, in its own session: QEMU reads a lazy base's blocks
through it, so it must outlive a node process that dies (a VM never outlives its node here,
`vmm/qemu.py`'s PDEATHSIG; but a restarted node adopts the service with its chunk cache
warm instead of racing a second one for the socket), and a crash of it costs a restart of
it alone: QEMU's NBD client holds the guest's reads for its `reconnect-delay` and
reconnects (`shared/lazybase.py`).

Dead is not only exited: a service that accepts nothing or sends no NBD greeting within
`PROBE_TIMEOUT_S`, `PROBE_STRIKES` probes in a row, holds its guests' reads forever (QEMU's
reconnect-delay only starts when a connection drops), so it is killed and restarted. One
that cannot be brought back within QEMU's reconnect window has the VMs reading through it
ended (`on_down`, `blockoutage.py`): their reads would fail from then on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from bus.tasks import cancel_and_wait
from shared.lazybase import RECONNECT_DELAY_S
from workers.node.blockoutage import Outage

__all__ = ["BlockService", "answers"]

log = logging.getLogger(__name__)

#: An NBD server's first bytes (fixed newstyle and oldstyle alike).
NBD_MAGIC = b"NBDMAGIC"
#: How long a start waits for the socket to answer (the service opens its repository
#: first: an S3 client, a bucket check).
START_TIMEOUT_S = 30.0
#: Restart delays: doubled after each death in a row, back to the first once the service
#: stayed up `STEADY_S`.
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
STEADY_S = 60.0
#: How often the watch looks at the process.
POLL_S = 0.5
#: A running service is asked for its greeting this often; one that gives none within
#: the timeout, that many times in a row, hangs: killed and restarted. A few seconds: a
#: busy node (TCG guests on two cores) is slow, but the greeting is the service's first
#: act on a connection, before any fetch.
PROBE_EVERY_S = 2.0
PROBE_TIMEOUT_S = 3.0
PROBE_STRIKES = 2
#: How long a stop waits for the service to exit on SIGTERM before SIGKILL.
STOP_TIMEOUT_S = 10.0
#: How long a stop waits for the last VM reading through the service to go.
IN_USE_GRACE_S = 5.0


async def answers(socket: Path, timeout: float = 2.0) -> bool:
    """Whether an NBD server answers on `socket` (its greeting's magic)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(socket), timeout)
    except (OSError, TimeoutError):
        return False
    try:
        return await asyncio.wait_for(reader.readexactly(len(NBD_MAGIC)), timeout) == NBD_MAGIC
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        return False
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not: its parent has not reaped it yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


class BlockService:
    """One block service process on one socket, supervised."""

    def __init__(
        self,
        argv: Sequence[str],
        socket: Path,
        pid_file: Path,
        *,
        log_file: Path,
        in_use: Callable[[], bool] = lambda: False,
        in_use_grace_s: float = IN_USE_GRACE_S,
        window_s: float = RECONNECT_DELAY_S,
        probe_every_s: float = PROBE_EVERY_S,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
    ) -> None:
        self.argv = list(argv)
        self.socket = socket
        #: written by the service itself once it runs; read to adopt it
        self.pid_file = pid_file
        #: the service's stdout and stderr (a file: a pipe would die with this process)
        self.log_file = log_file
        #: whether a VM reads through the service now (then a node stop leaves it running)
        self.in_use = in_use
        self.in_use_grace_s = in_use_grace_s
        self.pid: int | None = None
        #: restarts after a death (a metric's worth: a service that keeps dying is a bug)
        self.restarts = 0
        #: killed for hanging (no greeting), then restarted like a death
        self.hangs = 0
        #: the service's downtime, judged against QEMU's reconnect window
        self.outage = Outage(window_s)
        #: run once per outage past the window: the node ends the VMs on lazy images
        self.on_down: Callable[[], Awaitable[object]] | None = None
        self.probe_every_s = probe_every_s
        self.probe_timeout_s = probe_timeout_s
        self._child: subprocess.Popen[bytes] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._judge: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Adopt the service a previous node process left, else start one; then watch it."""
        adopted = await self._adoptable()
        if adopted is not None:
            self.pid = adopted
            log.info("block service: adopted pid %d on %s", adopted, self.socket)
        else:
            await self._spawn()
        self._watch = asyncio.create_task(self._watching(), name="block-service-watch")
        self._judge = asyncio.create_task(self._judging(), name="block-service-outage")

    async def _adoptable(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        try:  # a pid reused by another program is not the service
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        if str(self.socket).encode() not in cmdline or not _alive(pid):
            return None
        return pid if await answers(self.socket) else None

    async def _spawn(self) -> None:
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        if self.socket.exists() and not await answers(self.socket):
            self.socket.unlink()  # a dead service's: the new one binds it afresh
        # a Popen, not an asyncio subprocess: asyncio kills a child whose transport is
        # closed or collected, and this one must outlive the node when a VM still reads
        self._child = await asyncio.to_thread(self._popen)
        self.pid = self._child.pid
        deadline = time.monotonic() + START_TIMEOUT_S
        while not await answers(self.socket):
            if self._child.poll() is not None:
                raise RuntimeError(
                    f"block service exited ({self._child.returncode}) during start-up: "
                    f"see {self.log_file}"
                )
            if time.monotonic() > deadline:
                self._child.kill()  # hung: the next start must find the socket free
                raise RuntimeError(f"block service did not answer on {self.socket} in time")
            await asyncio.sleep(0.05)
        log.info("block service: pid %d serving on %s", self.pid, self.socket)

    def _popen(self) -> subprocess.Popen[bytes]:
        with open(self.log_file, "ab") as out:
            return subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a node's signals and death are not its own
            )

    def _running(self) -> bool:
        if self._child is not None:
            return self._child.poll() is None
        return self.pid is not None and _alive(self.pid)

    async def _watching(self) -> None:
        backoff = FIRST_BACKOFF_S
        up_since = time.monotonic()
        probed = time.monotonic()
        strikes = 0
        while True:
            await asyncio.sleep(POLL_S)
            if self._running():
                if time.monotonic() - up_since > STEADY_S:
                    backoff = FIRST_BACKOFF_S
                if time.monotonic() - probed < self.probe_every_s:
                    continue
                probed = time.monotonic()
                strikes = 0 if await answers(self.socket, self.probe_timeout_s) else strikes + 1
                if strikes < PROBE_STRIKES:
                    continue
                strikes = 0
                self.hangs += 1
                log.warning("block service (pid %s) gives no greeting: killed", self.pid)
                await self._kill()
            self.outage.down(time.monotonic())
            code = self._child.returncode if self._child is not None else None
            log.warning(
                "block service (pid %s) died (exit %s): restarting in %.1f s",
                self.pid,
                code,
                backoff,
            )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)
            try:
                await self._spawn()
            except Exception:
                log.exception("block service: restart failed")
                continue
            self.restarts += 1
            self.outage.up()
            up_since = probed = time.monotonic()

    async def _kill(self) -> None:
        """SIGKILL the service (a hung one ignores SIGTERM's wish) and see it gone: QEMU's
        connections to it drop, and its reconnect window starts."""
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        await self._exited(STOP_TIMEOUT_S)

    async def _judging(self) -> None:
        """The outage against QEMU's window, looked at on a clock of its own: a restart may
        take `START_TIMEOUT_S` before failing, and the VMs cannot wait for it."""
        while True:
            await asyncio.sleep(POLL_S)
            if not self.outage.due(time.monotonic()):
                continue
            log.error(
                "block service down for %.0f s (past QEMU's reconnect window): ending the "
                "VMs that read through it",
                self.outage.lasted(time.monotonic()),
            )
            if self.on_down is None:
                continue
            try:
                await self.on_down()
            except Exception:  # the next outage must be judged all the same
                log.exception("block service: ending the VMs on it failed")

    async def _exited(self, timeout: float) -> bool:
        """Whether the service ended within `timeout` (looked for, not waited on: an
        adopted one is not our child; ours is reaped by `poll`)."""
        for _ in range(int(timeout / 0.05)):
            if not self._running():
                return True
            await asyncio.sleep(0.05)
        return not self._running()

    async def _still_used(self) -> bool:
        """Whether a VM reads through the service `in_use_grace_s` from now: on a node's
        stop its QEMUs are on their way out (they die with the node), not gone yet."""
        for _ in range(int(self.in_use_grace_s / 0.25)):
            if not await asyncio.to_thread(self.in_use):
                return False
            await asyncio.sleep(0.25)
        return await asyncio.to_thread(self.in_use)

    async def stop(self) -> None:
        """Stop watching; end the service unless a VM still reads through it (a node
        restarted meanwhile adopts it)."""
        for task in (self._watch, self._judge):
            if task is not None:
                await cancel_and_wait(task)
        if self.pid is None or not self._running():
            return
        if await self._still_used():
            log.info("block service: pid %d left running, VMs read through it", self.pid)
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        if not await self._exited(STOP_TIMEOUT_S):
            log.warning("block service: pid %d ignored SIGTERM: killed", self.pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            await self._exited(STOP_TIMEOUT_S)
        log.info("block service: pid %d stopped", self.pid)
