"""process.Process: the Connect service behind `sandbox.commands` and `sandbox.pty`."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Sequence
from typing import Any

from envd import auth, wire
from envd.connect import Call, RpcError, Send, next_item
from envd.procs import Proc, ProcessTable, SpawnSpec, Subscriber, replay
from envd.shells import resolve_argv
from envd.state import State
from envd.users import resolve_path

KEEPALIVE = b'{"event":{"keepalive":{}}}'
#: What the SDK's `commands.run(cmd)` starts (`/bin/bash -l -c cmd`), run once at start-up:
#: see `ProcessService.warm`.
WARM_ARGV = ("/bin/bash", "-l", "-c", "true")
WARM_TIMEOUT_S = 10.0


def _strings(value: object, what: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RpcError("invalid_argument", f"{what} must be a list of strings")
    return value


def _str_map(value: object, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise RpcError("invalid_argument", f"{what} must be a map of strings")
    return value


class ProcessService:
    """Handlers of process.Process, over one ProcessTable."""

    def __init__(self, state: State, table: ProcessTable) -> None:
        self.state = state
        self.table = table

    async def warm(self, argv: Sequence[str] = WARM_ARGV) -> None:
        """Start what a sandbox's first command starts, the way it starts it, and wait for
        its end. Every sandbox is a restore of a template captured after envd's warm-up
        `/init`, which waits for this: the capture then holds bash, its libraries and the
        login scripts in the guest's page cache, and this code path run once. Without it
        every sandbox read them from its disk on its first command — under TCG, 371 ms
        against 161 ms for the second one."""
        user = self.state.default_user
        cwd = resolve_path("", user, self.state.default_workdir)
        spec = SpawnSpec(
            argv=list(argv),
            env=self.state.process_env(user, {}),
            cwd=cwd if os.path.isdir(cwd) else "/",
            user=user,
            stdin=False,
            pty_size=None,
            timeout_s=WARM_TIMEOUT_S,
            config_json={},
            tag=None,
        )
        sub = Subscriber()
        proc = self.table.spawn(spec, first=sub)
        while not (await sub.queue.get())[0]:
            pass
        self.table.ended.forget(proc.pid)  # no one's process: nothing to connect to

    # --- helpers ------------------------------------------------------------------------

    def _select(self, msg: dict[str, Any]) -> Proc:
        selector = msg.get("process")
        if not isinstance(selector, dict):
            raise RpcError("invalid_argument", "process selector is required")
        pid = selector.get("pid")
        tag = selector.get("tag")
        if pid is not None:
            try:
                pid = int(pid)
            except (TypeError, ValueError) as e:
                raise RpcError("invalid_argument", "pid must be an integer") from e
            proc = self.table.find(pid=pid)
            if proc is None:
                raise RpcError("not_found", f"process with pid {pid} not found")
            return proc
        if isinstance(tag, str):
            proc = self.table.find(tag=tag)
            if proc is None:
                raise RpcError("not_found", f"process with tag {tag} not found")
            return proc
        raise RpcError("invalid_argument", "process selector needs a pid or a tag")

    async def _pump(self, call: Call, proc: Proc, sub: Subscriber, send: Send) -> None:
        """Forward the process's events to the stream until its end event, with keepalives.

        Everything queued is sent in one write: a chatty process costs one syscall per
        batch, not per chunk, and nothing waits for more output to arrive.
        """
        queue = sub.queue
        try:
            while True:
                if queue.empty():
                    try:
                        item = await next_item(queue, call.keepalive_s)
                    except asyncio.TimeoutError:  # noqa: UP041 - not an alias before 3.11
                        await send(KEEPALIVE)
                        continue
                else:
                    item = queue.get_nowait()
                batch = [item[1]]
                ended = item[0]
                while not ended and not queue.empty():
                    end, payload, _ = queue.get_nowait()
                    batch.append(payload)
                    ended = end
                sub.sending = item[2]  # kept for the next stream should this one be cut
                await send(*batch)
                sub.sending = None
                if ended:
                    return
                proc.maybe_resume()
        finally:
            proc.unsubscribe(sub)

    # --- RPCs ---------------------------------------------------------------------------

    async def start(self, call: Call, msg: dict[str, Any], send: Send) -> None:
        config = msg.get("process")
        if not isinstance(config, dict) or not isinstance(config.get("cmd"), str):
            raise RpcError("invalid_argument", "process.cmd is required")
        cmd: str = config["cmd"]
        args = _strings(config.get("args"), "process.args")
        envs = _str_map(config.get("envs"), "process.envs")
        cwd_in = config.get("cwd")
        user = auth.rpc_user(self.state, call.headers)
        cwd = resolve_path(
            cwd_in if isinstance(cwd_in, str) else "", user, self.state.default_workdir
        )
        if not os.path.isdir(cwd):
            raise RpcError("invalid_argument", f"cwd '{cwd}' does not exist")
        pty_size: tuple[int, int] | None = None
        pty = msg.get("pty")
        if isinstance(pty, dict):
            size = pty.get("size") or {}
            pty_size = (int(size.get("cols") or 80), int(size.get("rows") or 24))
        stdin = msg.get("stdin")
        tag = msg.get("tag")
        spec = SpawnSpec(
            argv=resolve_argv([cmd, *args]),
            env=self.state.process_env(user, envs),
            cwd=cwd,
            user=user,
            stdin=True if stdin is None else bool(stdin),
            pty_size=pty_size,
            timeout_s=call.timeout_s,
            config_json=config,
            tag=tag if isinstance(tag, str) else None,
        )
        sub = Subscriber()
        try:
            proc = self.table.spawn(spec, first=sub)
        except PermissionError as e:
            raise RpcError("permission_denied", f"error starting process: {e}") from e
        except OSError as e:
            raise RpcError("internal", f"error starting process: {e}") from e
        await send(b'{"event":{"start":{"pid":%d}}}' % proc.pid)
        await self._pump(call, proc, sub, send)

    async def connect(self, call: Call, msg: dict[str, Any], send: Send) -> None:
        """Attach to a running process (what was read while no stream was attached comes
        first, then what it writes, then its end) or, for one that ended a short while ago
        (`envd.tails`), replay the tail of its output and its end."""
        try:
            proc = self._select(msg)
        except RpcError as e:
            if e.code != "not_found":
                raise
            selector = msg["process"]
            pid = selector.get("pid")
            ended = self.table.ended.find(
                pid=None if pid is None else int(pid), tag=selector.get("tag")
            )
            if ended is None:
                raise
            await send(b'{"event":{"start":{"pid":%d}}}' % ended.pid)
            await send(*(payload for _, payload in replay(ended.tail)), ended.end)
            return
        sub = proc.subscribe()
        await send(b'{"event":{"start":{"pid":%d}}}' % proc.pid)
        await self._pump(call, proc, sub, send)

    async def list(self, call: Call, msg: dict[str, Any]) -> dict[str, Any]:
        return {"processes": [p.info_json() for p in self.table.procs.values()]}

    def _input(self, proc: Proc, inp: object) -> None:
        if not isinstance(inp, dict):
            raise RpcError("invalid_argument", "input is required")
        try:
            if "pty" in inp:
                proc.write_input(wire.unb64(inp["pty"]), pty=True)
            elif "stdin" in inp:
                proc.write_input(wire.unb64(inp["stdin"]), pty=proc.pty_master is not None)
        except ValueError as e:
            raise RpcError("invalid_argument", str(e)) from e
        except OSError as e:
            raise RpcError("failed_precondition", f"cannot write input: {e}") from e

    async def send_input(self, call: Call, msg: dict[str, Any]) -> dict[str, Any]:
        self._input(self._select(msg), msg.get("input"))
        return {}

    async def stream_input(
        self, call: Call, messages: AsyncIterator[dict[str, Any]]
    ) -> dict[str, Any]:
        proc: Proc | None = None
        async for msg in messages:
            if "start" in msg:
                start = msg["start"] if isinstance(msg["start"], dict) else {}
                proc = self._select(start)
            elif "data" in msg:
                if proc is None:
                    raise RpcError("failed_precondition", "first message must be start")
                data = msg["data"] if isinstance(msg["data"], dict) else {}
                self._input(proc, data.get("input"))
            # keepalive: nothing to do
        return {}

    async def send_signal(self, call: Call, msg: dict[str, Any]) -> dict[str, Any]:
        proc = self._select(msg)
        signum = wire.SIGNALS.get(msg.get("signal"))
        if signum is None:
            raise RpcError("invalid_argument", f"unsupported signal {msg.get('signal')!r}")
        proc.signal(signum)
        return {}

    async def close_stdin(self, call: Call, msg: dict[str, Any]) -> dict[str, Any]:
        proc = self._select(msg)
        try:
            proc.close_stdin()
        except OSError as e:
            raise RpcError("failed_precondition", str(e)) from e
        return {}

    async def update(self, call: Call, msg: dict[str, Any]) -> dict[str, Any]:
        proc = self._select(msg)
        pty = msg.get("pty")
        if isinstance(pty, dict):
            size = pty.get("size") or {}
            try:
                proc.resize(int(size.get("cols") or 80), int(size.get("rows") or 24))
            except ValueError as e:
                raise RpcError("failed_precondition", str(e)) from e
        return {}
