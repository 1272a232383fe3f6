"""The QEMU driver: one `QemuVm` per QEMU process, controlled over QMP (qemu.qmp, asyncio).

Every QMP call races the process's exit, so a QEMU that dies is reported within one event
loop turn (with its stderr and console tails) instead of surfacing as a hung await.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

from qemu.qmp import EventListener, ExecuteError, QMPClient
from qemu.qmp.error import QMPError

from workers.node.vmm import limits
from workers.node.vmm.argv import qemu_argv
from workers.node.vmm.errors import VmCrashed, VmmError, VmTimeout
from workers.node.vmm.ramkeep import qemu_env
from workers.node.vmm.spec import Incoming, LaunchSpec

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)

# QMP appears 30-160 ms after exec here; 15 s covers a loaded 2-core CI box with margin.
QMP_CONNECT_TIMEOUT = 15.0
MIGRATION_TIMEOUT = 120.0  # full-stream saves of multi-GiB private memory are slow under TCG


CLONE_NEWNET = 0x40000000


def _child_setup(netns_fd: int | None, die_with_parent: bool) -> Callable[[], None]:
    """What runs in the child between fork and exec: enter the VM's network namespace
    (only this process: it is single-threaded here) and die with the node process."""

    def setup() -> None:
        if netns_fd is not None and _libc.setns(netns_fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns into the VM's network namespace failed")
        if die_with_parent:
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    return setup


#: In a VM's directory: its QEMU's pid.
PID_FILE = "qemu.pid"


class QemuVm:
    """A running QEMU process and its QMP session."""

    def __init__(self, spec: LaunchSpec, proc: asyncio.subprocess.Process):
        self.spec = spec
        self.proc = proc
        self.qmp = QMPClient(spec.vm_id)
        self._stderr: deque[str] = deque(maxlen=60)
        self._stderr_task = asyncio.create_task(self._drain_stderr())
        self._exit_task: asyncio.Task[int] = asyncio.create_task(proc.wait())
        self.qemu_version: str | None = None
        self.cgroup: limits.Applied | None = None
        if spec.mem_limit_bytes is not None and proc.pid is not None:
            cap = limits.Limits(spec.mem_limit_bytes, spec.cpu_limit or spec.machine.vcpus)
            self.cgroup = limits.apply(proc.pid, f"{spec.vm_id}-{proc.pid}", cap)
            if spec.background:
                self.set_background(True)

    # ---- lifecycle -------------------------------------------------------------------
    @classmethod
    async def launch(cls, spec: LaunchSpec, *, die_with_parent: bool = True) -> QemuVm:
        """Start QEMU and connect QMP. For a restore, also loads the state (VM left paused)."""
        spec.workdir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            spec.qmp_socket.unlink()
        argv = qemu_argv(spec)
        log.debug("launch %s (netns %s): %s", spec.vm_id, spec.netns, " ".join(argv))
        env = qemu_env(spec)  # before the netns fd: a refusal leaks nothing
        netns_fd = os.open(spec.netns, os.O_RDONLY) if spec.netns else None
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                preexec_fn=_child_setup(netns_fd, die_with_parent),
                start_new_session=True,
            )
        except (OSError, subprocess.SubprocessError) as e:
            raise VmmError(f"cannot start QEMU for {spec.vm_id}: {e}") from e
        finally:
            if netns_fd is not None:
                os.close(netns_fd)
        vm = cls(spec, proc)
        # which process is this VM's, for operators and tests (a command line names the
        # directory the VM started in: a warm VM's is renamed when a sandbox claims it)
        (spec.workdir / PID_FILE).write_text(f"{proc.pid}\n")
        try:
            await vm._connect_qmp()
            if isinstance(spec.start, Incoming):
                await vm._load_state(spec.start.state, ram_in_stream=spec.start.ram_in_stream)
        except BaseException:
            await vm.kill()
            raise
        return vm

    async def _connect_qmp(self) -> None:
        deadline = time.monotonic() + QMP_CONNECT_TIMEOUT
        while True:
            if self._exit_task.done():
                raise self.crash_error()
            if self.spec.qmp_socket.exists():
                try:
                    await self.qmp.connect(str(self.spec.qmp_socket))
                    break
                except (OSError, QMPError):
                    pass
            if time.monotonic() > deadline:
                raise VmTimeout(f"VM {self.spec.vm_id}: QMP did not come up in time")
            await asyncio.sleep(0.002)
        greeting = self.qmp.greeting
        if greeting is not None:
            v: Any = greeting.QMP.version["qemu"]
            self.qemu_version = f"{v['major']}.{v['minor']}.{v['micro']}"

    async def _load_state(self, state: Path, *, ram_in_stream: bool = False) -> None:
        await self.execute("migrate-set-capabilities", _ignore_shared(not ram_in_stream))
        await self._pass_fd(state, os.O_RDONLY, "incoming")
        await self.execute("migrate-incoming", {"uri": "fd:incoming"})
        deadline = time.monotonic() + MIGRATION_TIMEOUT
        while (await self.status()) == "inmigrate":
            if time.monotonic() > deadline:
                raise VmTimeout(f"VM {self.spec.vm_id}: loading {state} did not finish")
            await asyncio.sleep(0.001)

    async def _pass_fd(self, path: Path, flags: int, name: str) -> None:
        """Hand QEMU an open file over QMP (SCM_RIGHTS) as fd `name`: a migration to or from
        it then costs no `exec:` shell and `cat` process per VM (a 16-way fork used to start
        32 of them on the critical path)."""
        fd = os.open(path, flags, 0o600)
        try:
            self._send_fd(fd)
            await self.execute("getfd", {"fdname": name})
        finally:
            os.close(fd)

    def _send_fd(self, fd: int) -> None:
        """One space byte with `fd` attached, on the QMP socket; QEMU keeps the fd for the
        next command (`getfd`) and its JSON parser skips the space. Not `qmp.send_fd_scm`:
        that reaches into the stdlib loop's socket wrapper, which uvloop (the node's loop,
        aenv/eventloop.py) does not have; a duplicate of the socket's descriptor works on
        both. Nothing else is being written meanwhile: QMP commands are awaited one by one."""
        writer = self.qmp._writer  # qemu.qmp exposes no transport otherwise
        if writer is None:
            raise VmmError(f"VM {self.spec.vm_id}: QMP is not connected")
        sock = writer.transport.get_extra_info("socket")
        with socket.fromfd(sock.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as dup:
            socket.send_fds(dup, [b" "], [fd])

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return not self._exit_task.done()

    async def wait_exit(self) -> int:
        return await asyncio.shield(self._exit_task)

    def oom_killed(self) -> bool:
        """Whether the kernel's OOM killer ended this QEMU in its memory cgroup (read before
        `kill()` removes the cgroup)."""
        return limits.oom_kills(self.cgroup) > 0

    async def quit(self, timeout: float = 5.0) -> None:
        """Ask QEMU to exit; SIGKILL if it does not within `timeout`."""
        if self.alive:
            with contextlib.suppress(VmmError):
                await self.execute("quit", timeout=timeout)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._exit_task), timeout)
        await self.kill()

    async def kill(self) -> None:
        """Kill and reap; always leaves no process and no QMP session behind. Idempotent."""
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._exit_task), 5.0)
        with contextlib.suppress(Exception):
            await self.qmp.disconnect()
        self._stderr_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._stderr_task
        limits.remove(self.cgroup)
        self.cgroup = None

    # ---- QMP -------------------------------------------------------------------------
    async def execute(
        self, cmd: str, args: Mapping[str, object] | None = None, *, timeout: float = 30.0
    ) -> Any:
        """One QMP command, raced against QEMU's exit and bounded by `timeout`."""
        if not self.alive:
            raise self.crash_error()
        call = asyncio.ensure_future(self.qmp.execute(cmd, args))
        done, _ = await asyncio.wait(
            {call, self._exit_task}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if call in done:
            try:
                return call.result()
            except ExecuteError as e:
                raise VmmError(f"VM {self.spec.vm_id}: {cmd} failed: {e.error.error.desc}") from e
            except QMPError as e:
                # A dying QEMU drops the socket a moment before its exit is reaped.
                await asyncio.wait({self._exit_task}, timeout=1.0)
                if not self.alive:
                    raise self.crash_error() from e
                raise VmmError(f"VM {self.spec.vm_id}: QMP {cmd}: {e}") from e
        call.cancel()
        with contextlib.suppress(BaseException):
            await call
        if not self.alive:
            raise self.crash_error()
        raise VmTimeout(f"VM {self.spec.vm_id}: QMP {cmd} took longer than {timeout}s")

    def set_background(self, on: bool) -> None:
        """Whether this VM yields the CPU to the others (a warm pool's VM, which no client
        waits on yet) or competes as usual (once a sandbox claimed it)."""
        limits.set_weight(self.cgroup, limits.WEIGHT_BACKGROUND if on else limits.WEIGHT_DEFAULT)

    async def events(self, *names: str) -> AsyncIterator[dict[str, Any]]:
        """QMP events of these names (`{"event", "data", "timestamp"}`) from now on, as
        they come, until QEMU exits."""
        listener = EventListener(names)
        self.qmp.register_listener(listener)
        try:
            while self.alive:
                get = asyncio.ensure_future(listener.get())
                done, _ = await asyncio.wait(
                    {get, self._exit_task}, return_when=asyncio.FIRST_COMPLETED
                )
                if get not in done:
                    get.cancel()
                    with contextlib.suppress(BaseException):
                        await get
                    return
                yield dict(get.result())
        finally:
            with contextlib.suppress(Exception):
                self.qmp.remove_listener(listener)

    async def status(self) -> str:
        reply = await self.execute("query-status")
        return str(reply["status"])

    async def stop(self) -> None:
        await self.execute("stop")

    async def cont(self) -> None:
        await self.execute("cont")

    async def save_state(self, dest: Path) -> int:
        """Write device state (not RAM: it lives in the shared memory file) to `dest`.

        The VM must be stopped. Returns the state file size. With private (share=off) RAM,
        QEMU has to stream all of it, which is slow: that is why running sandboxes keep
        their RAM in a shared file. Such a stream is written without `x-ignore-shared`
        (the capability is recorded in the stream and must match on load), so it can be
        loaded into a shared RAM file: a resumed fork child gets cheap pauses again.
        """
        # set either way: a restored VM keeps the capability its incoming migration had
        await self.execute("migrate-set-capabilities", _ignore_shared(self.spec.mem_shared))
        await self.execute("migrate-set-parameters", {"max-bandwidth": 64 << 30})
        await self._pass_fd(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "outgoing")
        await self.execute("migrate", {"uri": "fd:outgoing"})
        deadline = time.monotonic() + MIGRATION_TIMEOUT
        while True:
            info = await self.execute("query-migrate")
            st = info.get("status")
            if st == "completed":
                break
            if st in ("failed", "cancelled"):
                raise VmmError(
                    f"VM {self.spec.vm_id}: saving state failed: {info.get('error-desc', st)}"
                )
            if time.monotonic() > deadline:
                raise VmTimeout(f"VM {self.spec.vm_id}: saving state did not finish")
            await asyncio.sleep(0.001)
        return dest.stat().st_size

    async def snapshot_disk(self, new_top: Path) -> None:
        """Freeze the current top disk layer: QEMU stacks `new_top` (qcow2) over it."""
        await self.execute(
            "blockdev-snapshot-sync",
            {"device": "root", "snapshot-file": str(new_top), "format": "qcow2"},
        )

    # ---- diagnostics -----------------------------------------------------------------
    def stderr_tail(self) -> str:
        return "".join(self._stderr)

    def console_tail(self, limit: int = 4000) -> str:
        try:
            with open(self.spec.console_log, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def crash_error(self) -> VmCrashed:
        rc = self._exit_task.result() if self._exit_task.done() else None
        return VmCrashed(self.spec.vm_id, rc, self.stderr_tail(), self.console_tail())

    async def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            self._stderr.append(line.decode(errors="replace"))


def _ignore_shared(on: bool) -> dict[str, Any]:
    return {"capabilities": [{"capability": "x-ignore-shared", "state": on}]}
