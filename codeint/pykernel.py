"""A Python context: an IPython kernel (ipykernel) we launch ourselves and drive over ZMQ
with jupyter_client's asyncio client.

Launched directly rather than through jupyter_client's KernelManager so that it runs as
the sandbox's user (E2B's kernels do) with a connection file that user can read, in the
context's directory, with a clean environment; `kernel_startup.py` is run in it first
(E2B's MIME types for charts and DataFrames).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import signal
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from queue import Empty
from typing import Any

from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.connect import write_connection_file

from codeint import wire
from codeint.base import Context, RunAs, base_env

STARTUP = Path(__file__).with_name("kernel_startup.py")
# run_path: the startup's helpers stay out of the user's namespace
_STARTUP_LINE = f"import runpy as _r; _r.run_path({str(STARTUP)!r}); del _r"
READY_TIMEOUT_S = 300.0  # an emulated (TCG) guest imports IPython for tens of seconds

_RESEED = """\
import random as _aenv_r, sys as _aenv_s
_aenv_r.seed()
if "numpy" in _aenv_s.modules:
    _aenv_s.modules["numpy"].random.seed()
del _aenv_r, _aenv_s
"""


class KernelDied(Exception):
    """The kernel process exited under an execution."""


class PythonContext(Context):
    language = "python"

    def __init__(
        self,
        cwd: str,
        runas: RunAs | None,
        rundir: Path,
        context_id: str | None = None,
        python: str = sys.executable,
    ) -> None:
        super().__init__(cwd, runas, context_id)
        self.rundir, self.python = rundir, python
        self.proc: asyncio.subprocess.Process | None = None
        self.client: AsyncKernelClient | None = None
        self._pending: dict[str, asyncio.Queue[dict[str, Any] | None]] = {}
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self.rundir.mkdir(parents=True, exist_ok=True)
        conn = self.rundir / f"kernel-{self.id}.json"
        key = os.urandom(32).hex().encode()
        fname, _ = write_connection_file(str(conn), ip="127.0.0.1", key=key, kernel_name="python3")
        if self.runas:
            os.chown(fname, self.runas.uid, self.runas.gid)
        argv = [
            self.python,
            "-m",
            "ipykernel_launcher",
            "-f",
            fname,
            f"--IPKernelApp.exec_lines={_STARTUP_LINE}",
            "--HistoryManager.enabled=False",
        ]
        self.proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=self.cwd,
            env=base_env(self.runas),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
            **(self.runas.popen_kwargs() if self.runas else {}),
        )
        client = AsyncKernelClient(connection_file=fname)
        client.load_connection_file()
        client.start_channels(hb=False)
        self.client = client
        try:
            await asyncio.wait_for(self._ready(client), READY_TIMEOUT_S)
        except BaseException:
            await self.stop()
            raise
        self._tasks = [
            asyncio.create_task(self._route_iopub(client)),
            asyncio.create_task(self._drain_shell(client)),
            asyncio.create_task(self._watch(self.proc)),
        ]

    async def _ready(self, client: AsyncKernelClient) -> None:
        """Until the kernel answers kernel_info on shell and publishes on IOPub (a
        subscriber that joined late would lose the first execution's output). Not
        jupyter_client's wait_for_ready: it counts a missed heartbeat as a dead kernel,
        and an emulated guest importing IPython misses many."""
        assert self.proc is not None
        while True:
            if self.proc.returncode is not None:
                raise KernelDied(f"the Python kernel exited at start ({self.proc.returncode})")
            msg_id = client.kernel_info()
            try:
                while True:
                    reply = await client.get_shell_msg(timeout=2)
                    if reply.get("parent_header", {}).get("msg_id") == msg_id:
                        break
                while (await client.get_iopub_msg(timeout=2)).get("msg_type") != "status":
                    pass
                return
            except Empty:
                continue

    async def _route_iopub(self, client: AsyncKernelClient) -> None:
        while True:
            msg = await client.get_iopub_msg()
            queue = self._pending.get(msg.get("parent_header", {}).get("msg_id", ""))
            if queue is not None:
                queue.put_nowait(msg)

    async def _drain_shell(self, client: AsyncKernelClient) -> None:
        while True:  # execute replies: everything we need came on IOPub
            await client.get_shell_msg()

    async def _watch(self, proc: asyncio.subprocess.Process) -> None:
        await proc.wait()
        for queue in self._pending.values():
            queue.put_nowait(None)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._tasks = []
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.stop_channels()
            with contextlib.suppress(OSError):
                os.unlink(self.client.connection_file)
            self.client = None
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            await self.proc.wait()
        self.proc = None
        for queue in self._pending.values():
            queue.put_nowait(None)

    def interrupt(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGINT)

    async def _execute(self, code: str, *, silent: bool) -> AsyncIterator[dict[str, Any]]:
        """The IOPub messages of one execution until the kernel is idle again."""
        if self.client is None:
            raise KernelDied("the Python kernel is not running")
        msg_id = self.client.execute(
            code, silent=silent, store_history=not silent, allow_stdin=False, stop_on_error=True
        )
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._pending[msg_id] = queue
        try:
            while True:
                msg = await queue.get()
                if msg is None:
                    raise KernelDied("the Python kernel died")
                if msg["msg_type"] == "status":
                    if msg["content"].get("execution_state") == "idle":
                        return
                    continue
                yield msg
        finally:
            self._pending.pop(msg_id, None)

    async def _silent(self, code: str) -> None:
        async for _ in self._execute(code, silent=True):
            pass

    async def reseed(self) -> None:
        await self._silent(_RESEED)

    async def run(self, code: str, env: Mapping[str, str]) -> AsyncIterator[dict[str, Any]]:
        if env:
            await self._silent(
                "import os as _aenv_os\n"
                f"_aenv_saved = {{k: _aenv_os.environ.get(k) for k in {sorted(env)!r}}}\n"
                f"_aenv_os.environ.update({dict(env)!r})\n"
            )
        try:
            try:
                async for msg in self._execute(code, silent=False):
                    out = wire.from_jupyter(msg["msg_type"], msg["content"], _date_ns(msg))
                    if out is not None:
                        yield out
            except KernelDied as e:
                yield wire.error("KernelDied", str(e), [])
        finally:
            if env and self.client is not None and self.proc and self.proc.returncode is None:
                await self._silent(
                    "for _k, _v in _aenv_saved.items():\n"
                    "    if _v is None: _aenv_os.environ.pop(_k, None)\n"
                    "    else: _aenv_os.environ[_k] = _v\n"
                    "del _aenv_saved, _aenv_os\n"
                )

    async def warm(self, modules: list[str]) -> None:
        """Import `modules` (those installed) so a snapshot of this kernel has them loaded:
        the first `import pandas` after a restore then costs nothing."""
        names = ", ".join(repr(m) for m in modules)
        await self._silent(
            "import importlib as _aenv_il\n"
            f"for _m in ({names},):\n"
            "    try: _aenv_il.import_module(_m)\n"
            "    except Exception: pass\n"
            "del _aenv_il, _m\n"
        )


def _date_ns(msg: dict[str, Any]) -> int | None:
    date = msg.get("header", {}).get("date")
    if isinstance(date, dt.datetime):
        return int(date.timestamp() * 1e9)
    return None
