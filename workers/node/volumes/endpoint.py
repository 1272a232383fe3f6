"""The node's side of the volume content API: `/volumes/{id}/{file,dir,path}` on its proxy
port, what the API relays E2B's `/volumecontent/…` requests to (`api/volume_content.py`).

The node checks the volume's token itself, against the sha256 the log holds: its port is
reachable by whatever reaches the node, and no request is taken on the API's word. A read
works on this node's copy of the volume's latest version (pulled if it has none, under the
volume's node-local lock: no create here takes the image meanwhile). A change attaches the
volume to itself in the log first (`content-<id>`: one holder at a time, so no sandbox
mounts it while debugfs writes), does it, uploads the image as the volume's next version
and releases it with that version — a crash in between leaves the attachment, which the
node's restart releases unchanged (`release_content_writes`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from bus import Bus, MessageContext
from bus.decisions import execute
from domain import Conflict, DomainError, NotFound
from domain import volume as vo
from workers.node.volumes import debugfs
from workers.node.volumes.content import ContentError, Owner, VolumeContent
from workers.node.volumes.images import VolumeImages

__all__ = ["VolumeEndpoint", "release_content_writes"]

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

MAX_FILE = 4 << 30
_CHUNK = 1 << 20


def _sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class VolumeEndpoint:
    """An ASGI app for the paths under `/volumes/`."""

    def __init__(self, bus: Bus, images: VolumeImages, node_id: str) -> None:
        self.bus = bus
        self.images = images
        self.node_id = node_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._serve(scope, receive, send)
        except ContentError as e:
            await _json(send, e.status, {"code": e.status, "message": e.message})
        except Exception as e:
            log.exception(
                "volume content request %s %s failed", scope.get("method"), scope.get("path")
            )
            await _json(send, 500, {"code": 500, "message": f"volume operation failed: {e}"})

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        parts = scope.get("path", "").strip("/").split("/")
        if len(parts) != 3 or parts[0] != "volumes":
            raise ContentError(404, "no such volume route")
        _, volume_id, op = parts
        method = scope["method"]
        query = {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
        state = await self._authorised(scope, volume_id)
        path = query.get("path")
        if path is None:
            raise ContentError(400, "the path query parameter is required")
        owner = Owner(_int(query, "uid"), _int(query, "gid"), _int(query, "mode"))
        force = query.get("force", "false").lower() == "true"
        match (method, op):
            case ("GET", "path"):
                await _json(send, 200, await self._read(state, lambda c: c.stat(path)))
            case ("GET", "dir"):
                depth = _int(query, "depth") or 1
                await _json(send, 200, await self._read(state, lambda c: c.list_dir(path, depth)))
            case ("GET", "file"):
                await self._download(state, path, send)
            case ("PUT", "file"):
                source = await self._receive_file(volume_id, receive)
                try:
                    entry = await self._change(
                        state, lambda c: c.write(path, source, owner, force=force)
                    )
                finally:
                    source.unlink(missing_ok=True)
                await _json(send, 201, entry)
            case ("POST", "dir"):
                await _json(
                    send,
                    201,
                    await self._change(state, lambda c: c.make_dir(path, owner, force=force)),
                )
            case ("PATCH", "path"):
                body = await _body_json(receive)
                attrs = Owner(_field(body, "uid"), _field(body, "gid"), _field(body, "mode"))
                changed = await self._change(state, lambda c: c.set_attrs(path, attrs))
                await _json(send, 200, changed)
            case ("DELETE", "path"):
                await self._change(state, lambda c: c.remove(path))
                await _empty(send, 204)
            case _:
                raise ContentError(405, f"{method} is not allowed on /{op}")

    async def _authorised(self, scope: Scope, volume_id: str) -> vo.Volume:
        headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise ContentError(401, "missing volume token")
        if not volume_id.isalnum():
            raise ContentError(404, f"volume {volume_id} not found")
        state, _ = await self.bus.volumes.load(volume_id)
        if state is None or state.destroyed:
            raise ContentError(404, f"volume {volume_id} not found")
        if not hmac.compare_digest(_sha256(token.strip()), state.token_sha256):
            raise ContentError(401, "invalid volume token")
        if state.holder is not None:
            raise ContentError(
                409, f"volume '{state.name}' is in use by {vo.holder_label(state.holder)}"
            )
        return state

    def _content(self, volume_id: str) -> VolumeContent:
        return VolumeContent(self.images.image(volume_id), self.images.scratch(volume_id))

    async def _read(self, state: vo.Volume, op: Callable[[VolumeContent], Awaitable[Any]]) -> Any:
        vid = state.volume_id
        async with self.images.lock(vid):
            image = await self.images.ensure(vid, state.version.key if state.version else None)
            await debugfs.replay_journal(image)
            return await op(self._content(vid))

    async def _download(self, state: vo.Volume, path: str, send: Send) -> None:
        copy = await self._read(state, lambda c: c.read(path))
        try:
            size = copy.stat().st_size
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"application/octet-stream"),
                        (b"content-length", str(size).encode()),
                    ],
                }
            )
            with open(copy, "rb") as f:  # noqa: ASYNC230 (chunks of 1 MiB from local disk)
                while chunk := f.read(_CHUNK):
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            copy.unlink(missing_ok=True)

    async def _receive_file(self, volume_id: str, receive: Receive) -> Path:
        scratch = self.images.scratch(volume_id)
        scratch.mkdir(parents=True, exist_ok=True)
        dest = scratch / f"write-{uuid.uuid4().hex}"
        size = 0
        with open(dest, "wb") as f:  # noqa: ASYNC230 (the body as it arrives, to local disk)
            while True:
                message = await receive()
                body = message.get("body", b"")
                size += len(body)
                if size > MAX_FILE:
                    f.close()
                    dest.unlink(missing_ok=True)
                    raise ContentError(
                        413,
                        f"a file written through the volume API is at most {MAX_FILE >> 30} GiB",
                    )
                f.write(body)
                if not message.get("more_body", False):
                    break
        return dest

    async def _change(self, state: vo.Volume, op: Callable[[VolumeContent], Awaitable[Any]]) -> Any:
        """`op` with the volume attached to this write, then its result made the volume's
        next version."""
        vid = state.volume_id
        holder = f"{vo.CONTENT_HOLDER_PREFIX}{uuid.uuid4().hex[:16]}"
        context = MessageContext(actor=f"node:{self.node_id}")
        attach = vo.AttachVolume(volume_id=vid, holder=holder, node_id=self.node_id)
        try:
            after, _, _ = await execute(self.bus.volumes, attach, context)
        except Conflict as e:
            raise ContentError(409, e.message) from e
        except NotFound as e:
            raise ContentError(404, e.message) from e
        version = after.version.key if after is not None and after.version else None
        result: Any = None
        new: vo.VolumeVersion | None = None
        try:
            async with self.images.lock(vid):
                image = await self.images.prepare(vid, version, holder)
                await debugfs.replay_journal(image)
                result = await op(self._content(vid))
                uploaded = await self.images.upload(vid, holder)
                if uploaded is not None:
                    new = vo.VolumeVersion(
                        key=uploaded[0], size_bytes=uploaded[1], node_id=self.node_id
                    )
        finally:
            release = vo.ReleaseVolume(
                volume_id=vid, holder=holder, node_id=self.node_id, version=new
            )
            try:
                await execute(self.bus.volumes, release, context)
            except DomainError:
                log.exception("volume %s: releasing content write %s failed", vid, holder)
            if new is not None:
                self.images.released(vid, new.key)
            else:  # failed half way: the image is no version any more
                self.images.forget_holder(vid)
        return result


async def release_content_writes(bus: Bus, images: VolumeImages, node_id: str) -> int:
    """After a restart: content writes this node was doing when it died are over — their
    volumes are released unchanged, their half-written images dropped."""
    n = 0
    for vid, holder in images.holders().items():
        if not holder.startswith(vo.CONTENT_HOLDER_PREFIX):
            continue
        release = vo.ReleaseVolume(volume_id=vid, holder=holder, node_id=node_id)
        try:
            await execute(bus.volumes, release, MessageContext(actor=f"node:{node_id}"))
        except DomainError:
            log.exception("volume %s: releasing the write %s cut short failed", vid, holder)
            continue
        images.forget_holder(vid)
        n += 1
    return n


def _int(query: dict[str, str], name: str) -> int | None:
    raw = query.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw, 0) if raw.startswith("0o") else int(raw)
    except ValueError as e:
        raise ContentError(400, f"{name} must be an integer") from e


def _field(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ContentError(400, f"{name} must be a non-negative integer")
    return value


async def _body_json(receive: Receive) -> dict[str, Any]:
    raw = b""
    while True:
        message = await receive()
        raw += message.get("body", b"")
        if len(raw) > 64 << 10:
            raise ContentError(413, "body too large")
        if not message.get("more_body", False):
            break
    try:
        doc = json.loads(raw or b"{}")
    except ValueError as e:
        raise ContentError(400, f"body is not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise ContentError(400, "body must be a JSON object")
    return doc


async def _json(send: Send, status: int, doc: object) -> None:
    body = json.dumps(doc).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _empty(send: Send, status: int) -> None:
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": b""})
