"""A bash context: one long-lived `bash` whose state (variables, functions, cwd) persists
between executions, driven through pipes — Debian packages no Jupyter bash kernel, and the
client only sees E2B's lines anyway.

Each execution writes its code to a file and has the shell `source` it, then print a marker
with the exit status on stdout and a marker on stderr; output before a marker is the
execution's. An interrupt sends SIGINT to the shell's process group: the running command
dies and the shell's trap returns from the `source` (status 130) instead of exiting. A
nonzero status is reported as an error whose value is the status, as Jupyter's bash
kernel does. `exit` ends the shell; the next execution starts a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import signal
import uuid
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from codeint import wire
from codeint.base import Context, RunAs, base_env

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
INTERRUPT_GRACE_S = 2.0
# an execution's lines, or (stream, status) once a stream reached its marker
_Queue = asyncio.Queue[dict[str, Any] | tuple[str, int | None]]
_PRELUDE = "trap 'return 130 2>/dev/null' INT\n"


class BashContext(Context):
    language = "bash"

    def __init__(
        self, cwd: str, runas: RunAs | None, rundir: Path, context_id: str | None = None
    ) -> None:
        super().__init__(cwd, runas, context_id)
        self.rundir = rundir
        self.proc: asyncio.subprocess.Process | None = None
        self.count = 0
        self._busy = False
        self._marker = f"__AENV_DONE_{uuid.uuid4().hex}__"

    async def start(self) -> None:
        self.rundir.mkdir(parents=True, exist_ok=True)
        self.proc = await asyncio.create_subprocess_exec(
            "bash",
            "--norc",
            "--noprofile",
            cwd=self.cwd,
            env=base_env(self.runas),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            limit=1 << 20,
            **(self.runas.popen_kwargs() if self.runas else {}),
        )
        await self._send(_PRELUDE)

    async def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()

    def interrupt(self) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        # bash does not always run its trap (a builtin loop after an earlier interrupt):
        # a shell still busy after the grace is killed, and the next execution starts anew
        asyncio.get_running_loop().call_later(
            INTERRUPT_GRACE_S, self._kill_if_busy, proc, self.count
        )

    def _kill_if_busy(self, proc: asyncio.subprocess.Process, count: int) -> None:
        if self.proc is proc and self.count == count and self._busy:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

    async def _send(self, text: str) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(text.encode())
        await self.proc.stdin.drain()

    async def prepare(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            await self.start()  # the last execution ran `exit`
        await super().prepare()

    async def reseed(self) -> None:
        # $RANDOM's state was captured with the process; SRANDOM reads the kernel's RNG
        async for _ in self._run_script('[ -n "$SRANDOM" ] && RANDOM=$SRANDOM\n', quiet=True):
            pass

    def run(self, code: str, env: Mapping[str, str]) -> AsyncIterator[dict[str, Any]]:
        for name in env:
            if not _NAME.match(name):
                raise ValueError(f"env var name {name!r} is not a shell variable name")
        return self._run_script(code, env=env)

    async def _run_script(
        self, code: str, env: Mapping[str, str] | None = None, quiet: bool = False
    ) -> AsyncIterator[dict[str, Any]]:
        assert self.proc is not None and self.proc.stdout and self.proc.stderr
        script = self.rundir / f"bash-{self.id}.sh"
        fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(code if code.endswith("\n") else code + "\n")
        if self.runas:
            os.chown(script, self.runas.uid, self.runas.gid)
        set_env, restore = _env_lines(env or {})
        m = self._marker
        await self._send(
            f"{set_env}source {shlex.quote(str(script))}; __aenv_rc=$?; {restore}"
            f"printf '%s%d\\n' '{m}' \"$__aenv_rc\"; printf '%s\\n' '{m}' >&2\n"
        )
        if not quiet:
            self.count += 1
            yield wire.execution_count(self.count)
        queue: _Queue = asyncio.Queue()
        readers = [
            asyncio.create_task(self._read(self.proc.stdout, "stdout", queue)),
            asyncio.create_task(self._read(self.proc.stderr, "stderr", queue)),
        ]
        status: int | None = 0
        self._busy = True
        try:
            done = 0
            while done < 2:
                item = await queue.get()
                if isinstance(item, tuple):
                    done += 1
                    if item[0] == "stdout":
                        status = item[1]
                elif not quiet:
                    yield item
        finally:
            self._busy = False
            for r in readers:
                r.cancel()
            with contextlib.suppress(OSError):
                script.unlink()
        if status is None:
            await self.stop()
            if not quiet:
                yield wire.error(
                    "Exit", "the shell exited; the next execution starts a new one", []
                )
        elif status != 0 and not quiet:
            yield wire.error("", str(status), [])

    async def _read(self, stream: asyncio.StreamReader, name: str, queue: _Queue) -> None:
        """Lines of one stream until the marker; ('stdout', status) / ('stderr', None) then.
        A status of None means the shell ended (EOF) before the marker."""
        marker = self._marker.encode()
        while True:
            try:
                raw = await stream.readline()
            except ValueError:  # a line over the limit: hand it over in pieces
                raw = await stream.read(1 << 20)
            if not raw:
                queue.put_nowait((name, None))
                return
            at = raw.find(marker)
            if at < 0:
                queue.put_nowait(wire.stream(name, raw.decode(errors="replace")))
                continue
            if at > 0:
                queue.put_nowait(wire.stream(name, raw[:at].decode(errors="replace")))
            tail = raw[at + len(marker) :].strip()
            status = int(tail) if tail.isdigit() else 0
            queue.put_nowait((name, status if name == "stdout" else 0))
            return


def _env_lines(env: Mapping[str, str]) -> tuple[str, str]:
    """Shell lines that export `env` for one execution and put the old values back."""
    if not env:
        return "", ""
    sets, restores = [], []
    for i, (name, value) in enumerate(sorted(env.items())):
        sets.append(
            f'if [ -n "${{{name}+x}}" ]; then __aenv_s{i}=${name}; __aenv_h{i}=1; '
            f"else __aenv_h{i}=0; fi; export {name}={shlex.quote(value)}; "
        )
        restores.append(
            f'if [ "$__aenv_h{i}" = 1 ]; then export {name}="$__aenv_s{i}"; else unset {name}; fi; '
        )
    return "".join(sets), "".join(restores)
