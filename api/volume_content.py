"""E2B's volume content API (`Volume.list / read_file / write_file / make_dir / get_info /
update_metadata / remove`): `/volumecontent/{id}/{file,dir,path}`, authorised by the
volume's own token (`Authorization: Bearer`, not an API key). E2B's SDKs send it to
`E2B_VOLUME_API_URL`, which is this API's URL.

The operations run on a node, where volume images are (`workers/node/volumes/`): the one
that released the volume last (its copy needs no download) when it beats, else any node.
This relays the request to that node's proxy port and streams the answer back; the node
checks the token again against the log (its port must not be an open door), and a write
there attaches the volume to itself for the operation and records the new version.

As E2B says, the volume API is for a volume no sandbox mounts: one that a sandbox holds
(running or paused — a paused guest's page cache still holds the file system) answers
409, since the host cannot change an ext4 a guest kernel has mounted, nor read it
consistently.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from litestar import Request, Response, route
from litestar.response import Stream

from api.context import ApiContext
from api.errors import ApiError, documented
from api.ids import is_sandbox_id
from api.mounts import free_volume
from api.volumes import token_sha256
from bus.nodes import is_gone
from domain import volume as vo

__all__ = ["ROUTES"]

log = logging.getLogger(__name__)

#: A file written through the volume API may be this large (a larger one is better
#: written from a sandbox that mounts the volume).
MAX_FILE = 4 << 30
OPS = ("file", "dir", "path")
#: The node's answer may take as long as a large read or an upload of a large write.
RELAY_TIMEOUT = httpx.Timeout(600.0, connect=5.0)
_PASSED = ("content-type", "content-disposition", "retry-after")


def _token(request: Request[Any, Any, Any]) -> str:
    raw = request.headers.get("authorization") or ""
    scheme, _, token = raw.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(
            401,
            "missing volume token: Authorization: Bearer <token> (the token "
            "Volume.create or Volume.connect returns)",
        )
    return token.strip()


async def authorised(ctx: ApiContext, volume_id: str, token: str) -> vo.Volume:
    if not is_sandbox_id(volume_id):
        raise ApiError(404, f"volume {volume_id} not found")
    state, _ = await ctx.bus.volumes.load(volume_id)
    if state is None or state.destroyed:
        raise ApiError(404, f"volume {volume_id} not found")
    if not hmac.compare_digest(token_sha256(token), state.token_sha256):
        raise ApiError(401, "invalid volume token")
    return state


def _node_proxy(ctx: ApiContext, state: vo.Volume) -> str:
    """The proxy of the node to do it: the one that released the volume last, else any."""
    beats = ctx.nodes.current() if ctx.nodes is not None else None
    if not beats:
        raise ApiError(
            503,
            "no node is running: volume content is served by the nodes",
            headers={"Retry-After": "5"},
        )
    now = time.time()
    live = {n: b for n, b in beats.items() if not is_gone(b, now) and b.proxy}
    home = state.version.node_id if state.version else None
    if home in live:
        return str(live[home].proxy)
    if not live:
        raise ApiError(
            503,
            "no node is running: volume content is served by the nodes",
            headers={"Retry-After": "5"},
        )
    best = max(live.values(), key=lambda b: (b.free, b.node_id))
    return str(best.proxy)


@route(
    "/volumecontent/{volume_id:str}/{op:str}",
    http_method=["GET", "PUT", "POST", "PATCH", "DELETE"],
    request_max_body_size=MAX_FILE,
    responses=documented(400, 401, 404, 409, 413, 500, 503),
)
async def volume_content(
    volume_id: str, op: str, request: Request[Any, Any, Any], ctx: ApiContext
) -> Response[Any]:
    """One content operation, relayed to a node (see the module's docstring)."""
    if op not in OPS:
        raise ApiError(404, f"no volume content route {op!r}")
    token = _token(request)
    state = await authorised(ctx, volume_id, token)
    # a volume whose sandbox ended is still being released: wait for that, as a create does
    state = await free_volume(
        ctx, volume_id, state.name, team_id=None, holder=None, actor=f"volume:{volume_id}"
    )
    proxy = _node_proxy(ctx, state)
    url = f"http://{proxy}/volumes/{volume_id}/{op}"
    headers = {"authorization": f"Bearer {token}"}
    if ct := request.headers.get("content-type"):
        headers["content-type"] = ct
    client = httpx.AsyncClient(timeout=RELAY_TIMEOUT)
    try:
        body = request.stream() if request.method in ("PUT", "POST", "PATCH") else None
        upstream = client.build_request(
            request.method, url, params=dict(request.query_params), headers=headers, content=body
        )
        answer = await client.send(upstream, stream=True)
    except httpx.HTTPError as e:
        await client.aclose()
        log.warning("volume %s: node at %s did not answer: %s", volume_id, proxy, e)
        raise ApiError(
            503,
            f"the node serving volume content did not answer: {e}",
            headers={"Retry-After": "5"},
        ) from e

    async def relay() -> AsyncIterator[bytes]:
        try:
            async for chunk in answer.aiter_raw():
                yield chunk
        finally:
            await answer.aclose()
            await client.aclose()

    passed = {k: v for k, v in answer.headers.items() if k.lower() in _PASSED}
    return Stream(relay(), status_code=answer.status_code, headers=passed)


ROUTES = [volume_content]
