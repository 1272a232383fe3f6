"""envd's composition root: the route table and the error boundary around every request."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable

from envd import auth, connect, files, log, metrics
from envd.connect import (
    BidiStreamHandler,
    ClientStreamHandler,
    ServerStreamHandler,
    UnaryHandler,
)
from envd.fs_rpc import FilesystemService
from envd.guest_init import handle_init
from envd.httpserver import HttpError, Request
from envd.process_rpc import ProcessService
from envd.procs import ProcessTable
from envd.state import State


class App:
    """Routes requests to the Connect services and the plain HTTP endpoints."""

    def __init__(self, state: State, loop: asyncio.AbstractEventLoop) -> None:
        self.state = state
        self.table = ProcessTable(loop, state.ended)
        p = ProcessService(state, self.table)
        self.process = p
        self.fs = FilesystemService(state, loop)
        fs = self.fs
        self.unary: dict[str, UnaryHandler] = {
            "/process.Process/List": p.list,
            "/process.Process/SendInput": p.send_input,
            "/process.Process/SendSignal": p.send_signal,
            "/process.Process/CloseStdin": p.close_stdin,
            "/process.Process/Update": p.update,
            "/filesystem.Filesystem/Stat": fs.stat,
            "/filesystem.Filesystem/ListDir": fs.list_dir,
            "/filesystem.Filesystem/MakeDir": fs.make_dir,
            "/filesystem.Filesystem/Move": fs.move,
            "/filesystem.Filesystem/Remove": fs.remove,
            "/filesystem.Filesystem/CreateWatcher": fs.create_watcher,
            "/filesystem.Filesystem/GetWatcherEvents": fs.get_watcher_events,
            "/filesystem.Filesystem/RemoveWatcher": fs.remove_watcher,
        }
        self.server_streams: dict[str, ServerStreamHandler] = {
            "/process.Process/Start": p.start,
            "/process.Process/Connect": p.connect,
            "/filesystem.Filesystem/WatchDir": fs.watch_dir,
        }
        self.client_streams: dict[str, ClientStreamHandler] = {
            "/process.Process/StreamInput": p.stream_input,
        }
        self.bidi_streams: dict[str, BidiStreamHandler] = {}  # envd's protos have none (yet)
        self.plain: dict[tuple[str, str], Callable[[Request], Awaitable[None]]] = {
            ("GET", "/files"): lambda r: files.download(state, r),
            ("POST", "/files"): lambda r: files.upload(state, r),
            ("POST", "/init"): lambda r: handle_init(state, r),
            ("GET", "/envs"): self._envs,
            ("GET", "/metrics"): self._metrics,
            # aenv's, for a filesystem-only pause: the disk made whole, and what the next
            # boot's /init must tell envd again (a built template's ENV, USER, WORKDIR)
            ("POST", "/sync"): self._sync,
            ("GET", "/defaults"): self._defaults,
            # aenv's, before the node stops a VM that mounts volumes: their writes on
            # their devices, each unmounted (or frozen, if busy) — `envd/volumes.py`
            ("POST", "/volumes/release"): self._release_volumes,
        }

    async def _envs(self, req: Request) -> None:
        await req.respond_json(200, self.state.env_vars)

    async def _metrics(self, req: Request) -> None:
        await req.respond_json(200, metrics.snapshot())

    async def _sync(self, req: Request) -> None:
        await asyncio.to_thread(os.sync)
        await req.respond_json(200, {})

    async def _release_volumes(self, req: Request) -> None:
        from envd import volumes

        try:
            body = json.loads(await req.read_all(64 * 1024) or b"{}")
            paths = body.get("paths") if isinstance(body, dict) else None
            if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
                raise ValueError("paths must be a list of strings")
        except ValueError as e:
            raise HttpError(400, f"invalid request: {e}") from e
        await req.respond_json(200, await asyncio.to_thread(volumes.release_all, paths))

    async def _defaults(self, req: Request) -> None:
        s = self.state
        body: dict[str, object] = {"envVars": dict(s.env_vars), "defaultUser": s.default_user_name}
        if s.default_workdir:
            body["defaultWorkdir"] = s.default_workdir
        await req.respond_json(200, body)

    async def handle(self, req: Request) -> None:
        """Serve one request; nothing but a short message ever reaches the wire on failure."""
        try:
            await self._route(req)
        except HttpError as e:
            if req.responded:
                req.close_after = True
            elif e.plain:
                await req.respond_text_error(e.status, e.message)
            else:
                await req.respond_error(e.status, e.message)
        except (ConnectionError, asyncio.IncompleteReadError):
            req.close_after = True
        except Exception as e:
            log.error("request failed", method=req.method, path=req.path, error=repr(e))
            if not req.responded:
                await req.respond_error(500, f"internal error: {type(e).__name__}")
            req.close_after = True

    async def _route(self, req: Request) -> None:
        path, method = req.path, req.method
        if path == "/health" and method == "GET":
            await req.respond(204)
            return
        if path == "/files" or (method == "POST" and path == "/init"):
            pass  # /files checks token-or-signature itself; /init checks the token itself
        elif path == "/envs" and method == "GET" and req.conn.from_loopback:
            # the sandbox's env vars, to a process in the guest (what E2B's code
            # interpreter asks at localhost:49983 without a token); processes envd starts
            # get them anyway, so this reveals nothing a guest process did not have
            pass
        elif not auth.token_ok(self.state, req):
            log.warn("request without a valid access token", path=path)
            raise HttpError(401, auth.UNAUTHORIZED)
        if (handler := self.unary.get(path)) is not None:
            self._post_only(req)
            await connect.serve_unary(req, handler)
        elif (stream := self.server_streams.get(path)) is not None:
            self._post_only(req)
            await connect.serve_server_stream(req, stream)
        elif (cstream := self.client_streams.get(path)) is not None:
            self._post_only(req)
            await connect.serve_client_stream(req, cstream)
        elif (bidi := self.bidi_streams.get(path)) is not None:
            self._post_only(req)
            await connect.serve_bidi_stream(req, bidi)
        elif (plain := self.plain.get((method, path))) is not None:
            await plain(req)
        elif any(p == path for _, p in self.plain):
            raise HttpError(405, f"method {method} not allowed on {path}")
        else:
            raise HttpError(404, f"no route for {method} {path}")

    @staticmethod
    def _post_only(req: Request) -> None:
        if req.method != "POST":
            raise HttpError(405, "Connect RPCs are POST only")

    def close(self) -> None:
        self.table.kill_all()
        self.fs.close_all()


__all__ = ["App"]
