"""The console's terminal: a WebSocket from the browser's xterm.js, bridged to a login shell
on a PTY in the guest (`pty.GuestPty`, envd's process API).

A browser cannot put a header on a WebSocket, so the key comes in the first message —
`{"key", "cols", "rows"}` — and is checked as every REST route checks `X-API-KEY`; the
sandbox must be the caller's (another team's is "not found", as on the REST routes) and
running. Then: binary frames from the browser are keystrokes, a text frame
`{"type": "resize", "cols", "rows"}` resizes the PTY; binary frames to the browser are what
the shell printed, text frames say `ready` (pid), `exit` (code) or `error` (message).
Refusals close the socket with 4000 + the HTTP status the REST API would answer
(4401, 4404, 4409, 4503) and its message as the reason.

The shell ends with the socket, and the socket with the shell; a sandbox paused or killed
meanwhile ends both (the log is asked every few seconds: a guest gone with its network
namespace never closes the stream itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from litestar import WebSocket, websocket

from api.console.pty import ENVD_PORT, GuestPty, PtyError
from api.context import ApiContext
from api.errors import ApiError
from api.guards import visible
from domain.sandbox import SandboxStatus
from shared.proxy import Resolver, SandboxUnavailable

log = logging.getLogger(__name__)

__all__ = ["ROUTES"]

#: How long the browser has to send its key after the socket opened.
HELLO_S = 10.0
#: How often a session asks the log whether its sandbox still runs.
CHECK_S = 3.0
_RUNNING = (SandboxStatus.RUNNING, SandboxStatus.SNAPSHOTTING, SandboxStatus.FORKING)
_MAX_COLS, _MAX_ROWS = 1000, 500


def _size(msg: dict[str, Any]) -> tuple[int, int]:
    try:
        cols, rows = int(msg.get("cols") or 80), int(msg.get("rows") or 24)
    except (TypeError, ValueError) as e:
        raise ApiError(400, "cols and rows must be integers") from e
    return max(1, min(cols, _MAX_COLS)), max(1, min(rows, _MAX_ROWS))


async def _hello(socket: WebSocket[Any, Any, Any]) -> dict[str, Any]:
    try:
        raw = await asyncio.wait_for(socket.receive_text(), HELLO_S)
    except TimeoutError as e:
        raise ApiError(401, "no API key sent") from e
    try:
        msg = json.loads(raw)
    except ValueError as e:
        raise ApiError(400, "the first message must be JSON: {key, cols, rows}") from e
    if not isinstance(msg, dict):
        raise ApiError(400, "the first message must be a JSON object: {key, cols, rows}")
    return msg


async def _open(
    ctx: ApiContext, resolve: Resolver, sandbox_id: str, msg: dict[str, Any]
) -> GuestPty:
    caller = await ctx.keys.caller(msg.get("key") if isinstance(msg.get("key"), str) else None)
    state = await visible(ctx, caller, sandbox_id)
    if state.status not in _RUNNING:
        raise ApiError(409, f"sandbox {sandbox_id} is {state.status.value}: resume it first")
    cols, rows = _size(msg)
    try:
        upstream = await resolve(sandbox_id, ENVD_PORT, None)
    except SandboxUnavailable as e:
        raise ApiError(503, f"sandbox {sandbox_id} cannot be reached now") from e
    pty = GuestPty(upstream, state.envd_access_token)
    try:
        await pty.open(cols, rows)
    except PtyError as e:
        await pty.close()
        raise ApiError(503, f"the sandbox's shell did not start: {e}") from e
    return pty


async def _to_browser(socket: WebSocket[Any, Any, Any], pty: GuestPty) -> None:
    async for out in pty.output():
        if isinstance(out, int):
            await socket.send_text(json.dumps({"type": "exit", "code": out}))
            return
        await socket.send_bytes(out)


async def _from_browser(socket: WebSocket[Any, Any, Any], pty: GuestPty) -> None:
    while True:
        msg: dict[str, Any] = dict(await socket.receive())
        if msg["type"] == "websocket.disconnect":
            return
        if msg.get("bytes"):
            await pty.send(msg["bytes"])
        elif msg.get("text"):
            with contextlib.suppress(ValueError, ApiError):
                control = json.loads(msg["text"])
                if isinstance(control, dict) and control.get("type") == "resize":
                    await pty.resize(*_size(control))
                elif isinstance(control, dict) and control.get("type") == "input":
                    await pty.send(str(control.get("data", "")).encode())


async def _stopped(ctx: ApiContext, sandbox_id: str) -> str | None:
    """Why the sandbox's shell cannot go on (`the sandbox is paused`), or None: it runs."""
    state, _ = await ctx.bus.sandboxes.load(sandbox_id)
    if state is None or state.status not in _RUNNING:
        return f"the sandbox is {state.status.value if state is not None else 'gone'}"
    return None


async def _watch(ctx: ApiContext, sandbox_id: str) -> str:
    """Returns once the sandbox stopped running, saying so."""
    while True:
        await asyncio.sleep(CHECK_S)
        if why := await _stopped(ctx, sandbox_id):
            return why


@websocket("/console/ws/sandboxes/{sandbox_id:str}/terminal", include_in_schema=False)
async def terminal(socket: WebSocket[Any, Any, Any], sandbox_id: str) -> None:
    ctx: ApiContext = socket.app.state.ctx
    resolve: Resolver = socket.app.state.resolve
    await socket.accept()
    try:
        pty = await _open(ctx, resolve, sandbox_id, await _hello(socket))
    except ApiError as e:
        await socket.close(
            code=4000 + e.status, reason=e.message.encode()[:120].decode(errors="ignore")
        )
        return
    tasks: list[asyncio.Task[Any]] = []
    try:
        await socket.send_text(json.dumps({"type": "ready", "pid": pty.pid}))  # before output
        tasks = [
            asyncio.create_task(_to_browser(socket, pty), name="pty-out"),
            asyncio.create_task(_from_browser(socket, pty), name="pty-in"),
            asyncio.create_task(_watch(ctx, sandbox_id), name="pty-watch"),
        ]
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            exc = task.exception()
            if task.get_name() == "pty-watch" and exc is None:
                why: str | None = task.result()
            elif isinstance(exc, PtyError):  # a stream cut by a kill or pause says so
                why = await _stopped(ctx, sandbox_id) or str(exc)
            else:  # the browser left, or the shell ended (its exit was sent)
                why = None
                if exc is not None:
                    log.warning("terminal of %s ended: %r", sandbox_id, exc)
            if why is not None:
                with contextlib.suppress(Exception):
                    await socket.send_text(json.dumps({"type": "error", "message": why}))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await pty.close()
        with contextlib.suppress(Exception):
            await socket.close()


ROUTES = [terminal]
