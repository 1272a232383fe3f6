"""The routes of E2B's code-interpreter protocol over `Contexts`.

`POST /execute` {code, context_id, language, env_vars} → 200 NDJSON stream (`wire`);
`POST /contexts` {language, cwd} → the context; `GET /contexts` → every context;
`POST /contexts/{id}/restart`, `DELETE /contexts/{id}` → 204; `GET /health` → 200.
Unknown context → 404 (the SDK raises NotFoundException with our text), bad input → 400.

An execution whose client hangs up (the SDK's `timeout` ran out, or the caller dropped the
request) interrupts the kernel, and the context's lock is held until the kernel is idle
again, so the next request finds it usable rather than still busy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from codeint import wire
from codeint.base import Context, valid_env
from codeint.contexts import BadRequest, Contexts, UnknownContext
from codeint.httpd import HttpError, Request
from codeint.sandbox_env import SandboxEnv

log = logging.getLogger("codeint")


class Server:
    def __init__(self, contexts: Contexts, sandbox_env: SandboxEnv | None = None) -> None:
        self.contexts = contexts
        #: the sandbox's own env vars (None: none, the server's tests on a host)
        self.sandbox_env = sandbox_env

    async def handle(self, req: Request) -> None:
        try:
            await self._route(req)
        except UnknownContext as e:
            raise HttpError(404, f"Context {e.args[0]} not found") from None
        except (BadRequest, ValueError) as e:
            raise HttpError(400, str(e)) from None
        except HttpError:
            raise
        except Exception as e:  # never a hang; the message says what failed
            log.exception("request %s %s failed", req.method, req.path)
            raise HttpError(500, f"{type(e).__name__}: {e}") from None

    async def _route(self, req: Request) -> None:
        parts = [p for p in req.path.split("/") if p]
        method = req.method
        if parts == ["health"] and method in ("GET", "HEAD"):
            await req.respond_json(200, {"status": "ok"})
        elif parts == ["execute"] and method == "POST":
            await self._execute(req)
        elif parts == ["contexts"] and method == "POST":
            body = req.json()
            ctx = await self.contexts.create(_opt_str(body, "language"), _opt_str(body, "cwd"))
            await req.respond_json(200, ctx.describe())
        elif parts == ["contexts"] and method == "GET":
            await req.respond_json(200, [c.describe() for c in self.contexts.list()])
        elif len(parts) == 2 and parts[0] == "contexts" and method == "DELETE":
            await self.contexts.remove(parts[1])
            await req.respond(204)
        elif (
            len(parts) == 3
            and parts[0] == "contexts"
            and parts[2] == "restart"
            and method == "POST"
        ):
            await self.contexts.restart(parts[1])
            await req.respond(204)
        elif parts and parts[0] in ("health", "execute", "contexts"):
            raise HttpError(405, f"{method} is not allowed on {req.path}")
        else:
            raise HttpError(404, f"no route {req.path}")

    async def _execute(self, req: Request) -> None:
        body = req.json()
        code = body.get("code")
        if not isinstance(code, str):
            raise BadRequest("code must be a string")
        context_id, language = _opt_str(body, "context_id"), _opt_str(body, "language")
        if context_id and language:
            raise BadRequest("give context_id or language, not both")
        env = valid_env(body.get("env_vars"))
        if self.sandbox_env is not None:  # the sandbox's own, under the request's
            env = {**await self.sandbox_env.get(), **env}
        ctx = self.contexts.get(context_id) if context_id else await self.contexts.default(language)
        async with ctx.lock:
            await ctx.prepare()
            await req.start_stream()
            await self._stream(req, ctx, ctx.run(code, env))
        await req.end_stream()

    async def _stream(
        self, req: Request, ctx: Context, lines: AsyncIterator[dict[str, Any]]
    ) -> None:
        """Relay the execution's lines; on a hang-up interrupt it and drain it to its end."""
        hangup = req.hangup()
        gone = False
        try:
            while True:
                nxt = asyncio.ensure_future(anext(lines))
                if not gone:
                    await asyncio.wait({nxt, hangup}, return_when=asyncio.FIRST_COMPLETED)
                    if not nxt.done():  # the client left while the kernel was silent
                        gone = True
                        log.info("client gone: interrupting context %s", ctx.id)
                        ctx.interrupt()
                try:
                    item = await nxt
                except StopAsyncIteration:
                    return
                if gone:
                    continue
                try:
                    await req.send_chunk(wire.line(item))
                except (ConnectionError, RuntimeError):
                    gone = True
                    ctx.interrupt()
        finally:
            with contextlib.suppress(Exception):
                await lines.aclose()  # type: ignore[attr-defined]
            if gone:
                req.keep_alive = False
                raise ConnectionResetError("client gone")


def _opt_str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise BadRequest(f"{key} must be a string")
    return value
