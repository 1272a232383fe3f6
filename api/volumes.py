"""E2B's volume control plane (`Volume.create / connect / list / get_info / destroy`):
`POST /volumes`, `GET /volumes`, `GET|DELETE /volumes/{id}` (`docs/volumes.md`).

A volume's id follows from its team and name (`domain.volume.volume_id_of`), so a create
is decided on the empty aggregate and a second create of one name is refused by the log
itself (409). Its token is E2B's `VolumeAndToken.token`, which the content API takes as
`Authorization: Bearer`: an HMAC of the volume's id and incarnation under the APIs'
shared secret (`AENV_UPLOAD_SECRET`), so any API can answer `GET /volumes/{id}` with it
again, while the log holds only its sha256 (what a node checks a content request with).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import uuid
from typing import Any
from uuid import UUID

from litestar import Response, delete, get, post

from api import wire
from api.auth import Caller
from api.context import ApiContext
from api.errors import ERRORS, ApiError
from api.ids import is_sandbox_id
from api.mounts import free_volume
from bus.decisions import execute
from bus.envelope import MessageContext
from domain import volume as vo
from projections import queries

__all__ = ["ROUTES", "mint_token", "token_sha256", "visible_volume"]

TOKEN_PREFIX = "vol_"


def mint_token(secret: str, volume_id: str, incarnation: UUID) -> str:
    """The token of one incarnation of a volume (a name created again gets another)."""
    mac = hmac.new(
        secret.encode(), f"volume-token|{volume_id}|{incarnation}".encode(), hashlib.sha256
    ).digest()
    return TOKEN_PREFIX + base64.urlsafe_b64encode(mac).decode().rstrip("=")


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def not_found(volume_id: str) -> ApiError:
    return ApiError(404, f"volume {volume_id} not found")


async def visible_volume(ctx: ApiContext, caller: Caller, volume_id: str) -> vo.Volume:
    """The write-side state of a volume of the caller's team that exists."""
    if not is_sandbox_id(volume_id):  # the same alphabet: anything else names nothing
        raise not_found(volume_id)
    state, _ = await ctx.bus.volumes.load(volume_id)
    if state is None or state.destroyed or state.team_id != caller.team_id:
        raise not_found(volume_id)
    return state


def _with_token(ctx: ApiContext, v: vo.Volume) -> wire.VolumeAndToken:
    token = mint_token(ctx.settings.upload_secret, v.volume_id, v.incarnation)
    if not hmac.compare_digest(token_sha256(token), v.token_sha256):
        # the APIs' secret is not the one this volume was created under
        raise ApiError(
            500,
            f"volume {v.volume_id}: its token cannot be derived here "
            "(AENV_UPLOAD_SECRET differs from the one it was created with)",
        )
    return wire.VolumeAndToken(volume_id=v.volume_id, name=v.name, token=token)


@post("/volumes", status_code=201, responses=ERRORS)
async def create_volume(data: wire.NewVolume, ctx: ApiContext, caller: Caller) -> dict[str, Any]:
    if not vo.is_volume_name(data.name):
        raise ApiError(
            400,
            f"invalid volume name {data.name!r}: use letters, digits, '.', "
            "'_' and '-' (at most 63, starting with a letter or digit)",
        )
    vid = vo.volume_id_of(caller.team_id, data.name)
    incarnation = uuid.uuid4()
    token = mint_token(ctx.settings.upload_secret, vid, incarnation)
    cmd = vo.CreateVolume(
        volume_id=vid,
        command_id=incarnation,
        team_id=caller.team_id,
        name=data.name,
        token_sha256=token_sha256(token),
    )
    state, version, _ = await execute(ctx.bus.volumes, cmd, MessageContext(actor=caller.key_id))
    assert state is not None
    await ctx.wait_for_volumes(version.seq)
    return wire.dump(wire.VolumeAndToken(volume_id=vid, name=state.name, token=token))


@get("/volumes", responses=ERRORS)
async def list_volumes(ctx: ApiContext, caller: Caller) -> list[dict[str, Any]]:
    seq = await ctx.bus.volumes.tail_seq()
    if seq:
        await ctx.wait_for_volumes(seq)
    async with ctx.engine.connect() as conn:
        rows = await queries.team_volumes(conn, caller.team_id)
    return [wire.dump(wire.Volume(volume_id=r["volume_id"], name=r["name"])) for r in rows]


@get("/volumes/{volume_id:str}", responses=ERRORS)
async def get_volume(volume_id: str, ctx: ApiContext, caller: Caller) -> dict[str, Any]:
    return wire.dump(_with_token(ctx, await visible_volume(ctx, caller, volume_id)))


@delete("/volumes/{volume_id:str}", status_code=204, responses=ERRORS)
async def destroy_volume(volume_id: str, ctx: ApiContext, caller: Caller) -> Response[None]:
    """Refused (409) while a sandbox mounts it; one that ended is waited for (its content
    is being made durable), as a create waits."""
    state = await visible_volume(ctx, caller, volume_id)
    await free_volume(
        ctx, volume_id, state.name, team_id=caller.team_id, holder=None, actor=caller.key_id
    )
    _, version, _ = await execute(
        ctx.bus.volumes, vo.DestroyVolume(volume_id=volume_id), MessageContext(actor=caller.key_id)
    )
    await ctx.wait_for_volumes(version.seq)
    return Response(None, status_code=204)


ROUTES = [create_volume, list_volumes, get_volume, destroy_volume]
