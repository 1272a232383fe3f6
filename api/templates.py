"""E2B's template routes (`Template.build()`, `Template.exists()`, template listing): a
build is requested, its build-context files uploaded, then started; the builder service
runs it in a build sandbox and the status route reports progress and logs.

Template names are the template ids as well (`Sandbox.create("<name>")` finds either).
Each build is captured as a template of its own and takes the template's `default` tag
and the tags it was asked for (`name:v1`, `tags`); `api/tags.py` moves them after.

A build is `waiting` from its request until its steps are sent (E2B's SDK uploads the
build's files meanwhile), then `building` — recorded here before the start is answered,
as E2B's, whether or not a builder has picked it up yet — then `ready` or `error`.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import re
import uuid
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

from litestar import Request, get, post, put
from litestar.params import Parameter

from api import ids, reads
from api.auth import Caller
from api.context import ApiContext
from api.errors import COMMON, ERRORS, ApiError, documented
from api.tags import fenced, parse_name
from api.wire_templates import BuildStart, NewTemplateBuild
from bus.decisions import execute
from bus.secrets import SecretBox
from domain import build as bd
from domain import sandbox as sb
from domain import tags as tg
from domain import template as tp
from envd.version import ENVD_VERSION
from projections import queries
from shared.images import InvalidImageReference, parse_reference

_HASH = re.compile(r"^[A-Za-z0-9_-]{8,128}$")
MAX_UPLOAD = 4 << 30  # a build context larger than 4 GiB is better baked into an image
_LOG_PAGE = 100


#: The SDK's default base image (`Template()`, `from_base_image()`): our `base` template is
#: the equivalent (Debian + python3 + envd), so those builds need no registry.
E2B_BASE_IMAGES = frozenset({"e2bdev/base", "e2bdev/base:latest", "docker.io/e2bdev/base"})


def base_of(data: BuildStart) -> tuple[str | None, str | None]:
    """(from_template, from_image) of a build start, E2B's base image mapped to `base`."""
    if data.from_image is not None and data.from_image.strip() in E2B_BASE_IMAGES:
        return "base", None
    return data.from_template, data.from_image


def _template_name(raw: str) -> tuple[str, str | None]:
    """`[team/]name[:tag]` → (a valid template id, the tag if one was named)."""
    name, tag = parse_name(raw)
    if name in tp.BUILTIN_TEMPLATES:
        raise ApiError(400, f"{name!r} is a built-in template and cannot be rebuilt")
    return name, tag


async def _build(ctx: ApiContext, caller: Caller, template_id: str, build_id: str) -> bd.Build:
    state, _ = await ctx.bus.builds.load(ids.build_id(build_id))
    if state is None or state.template_id != template_id or state.team_id != caller.team_id:
        raise ApiError(404, f"build {build_id} of template {template_id} not found")
    return state


@post("/v3/templates", status_code=202, responses=ERRORS)
async def request_build(data: NewTemplateBuild, ctx: ApiContext, caller: Caller) -> dict[str, Any]:
    raw = data.name or data.alias
    if not raw:
        raise ApiError(400, "a template build needs a name")
    name, tag = _template_name(raw)
    tags = tg.normalize_tags([*([tag] if tag else []), *data.tags])  # Invalid → 400
    build_id = str(uuid.uuid4())
    cmd = bd.RequestTemplateBuild(
        build_id=build_id,
        template_id=name,
        alias=name,
        team_id=caller.team_id,
        cpu_count=data.cpu_count or 2,
        memory_mb=data.memory_mb or 512,
        disk_size_mb=data.min_free_disk_mb or 0,
        tags=tags,
    )
    await execute(ctx.bus.builds, cmd)
    # what the build will be called once it succeeds: its tags, and `default` (the latest)
    named = list(dict.fromkeys([*tags, tg.DEFAULT_TAG]))
    return {
        "templateID": name,
        "buildID": build_id,
        "public": False,
        "names": [name],
        "tags": named,
        "aliases": [name],
    }


def _upload_token(ctx: ApiContext, template_id: str, files_hash: str) -> str:
    key = ctx.settings.upload_secret.encode()
    return hmac.new(key, f"{template_id}/{files_hash}".encode(), hashlib.sha256).hexdigest()


def files_path(root: Path, template_id: str, files_hash: str) -> Path:
    """Where an uploaded build-context archive lives (the builder reads the same place)."""
    return root / template_id / files_hash


def _files_root(ctx: ApiContext) -> Path:
    if ctx.settings.build_files_dir is None:
        raise ApiError(501, "build-context uploads are not configured on this server")
    return ctx.settings.build_files_dir


def _check_files(template_id: str, files_hash: str) -> None:
    if not bd.valid_template_name(template_id) or not _HASH.match(files_hash):
        raise ApiError(400, "invalid template id or files hash")


@get(
    "/templates/{template_id:str}/files/{files_hash:str}",
    status_code=201,
    responses=documented(*COMMON, 501),
)
async def file_upload_link(
    request: Request[Any, Any, Any],
    template_id: str,
    files_hash: str,
    ctx: ApiContext,
    caller: Caller,
) -> dict[str, Any]:
    """Where to PUT the tar(.gz) of one COPY step's files; `present` if we have it."""
    _check_files(template_id, files_hash)
    path = files_path(_files_root(ctx), template_id, files_hash)
    base = str(request.base_url).rstrip("/")
    token = _upload_token(ctx, template_id, files_hash)
    return {
        "present": path.exists(),
        "url": f"{base}/templates/{template_id}/files/{files_hash}?token={token}",
    }


@put(
    "/templates/{template_id:str}/files/{files_hash:str}",
    status_code=200,
    request_max_body_size=MAX_UPLOAD,
    responses=documented(400, 403, 413, 500, 501),
)
async def upload_files(
    request: Request[Any, Any, Any],
    template_id: str,
    files_hash: str,
    ctx: ApiContext,
    token: str = "",
) -> None:
    """The upload link's target: the signed token stands in for the API key (the SDK's
    uploader sends none). Written beside the target and renamed: never half a file."""
    _check_files(template_id, files_hash)
    if not hmac.compare_digest(token, _upload_token(ctx, template_id, files_hash)):
        raise ApiError(403, "invalid or missing upload token")
    path = files_path(_files_root(ctx), template_id, files_hash)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.part")
    try:
        with tmp.open("wb") as f:
            async for chunk in request.stream():
                await asyncio.to_thread(f.write, chunk)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


async def _names_a_template(ctx: ApiContext, image: str) -> bool:
    name = image.strip().removesuffix(":latest")
    if not bd.valid_template_name(name) or "/" in name or ":" in name:
        return False
    return await reads.template(ctx.engine, name) is not None


async def _registry_login(
    ctx: ApiContext, build_id: str, image: str | None, login: dict[str, object] | None
) -> str | None:
    """E2B's `fromImageRegistry`: a general registry's username and password. The password
    goes to the secrets bucket under the build id (the node that pulls reads it there); the
    build's events record only the username. AWS and GCP logins are refused: 400."""
    if not login:
        return None
    kind = login.get("type")
    if kind != "registry":
        raise ApiError(
            400,
            f"registry type {kind!r} is not supported: use type 'registry' "
            "with a username and password (push images from ECR or GCR to "
            "a registry that accepts those)",
        )
    username, password = login.get("username"), login.get("password")
    if not isinstance(username, str) or not username or not isinstance(password, str):
        raise ApiError(400, "fromImageRegistry needs a username and a password")
    if image is None or image.startswith("/"):
        raise ApiError(400, "fromImageRegistry goes with fromImage, a registry image")
    box = await SecretBox.open(ctx.bus.js, ctx.bus.names.secrets_bucket)
    await box.put(build_id, {"username": username, "password": password})
    return username


@post("/v2/templates/{template_id:str}/builds/{build_id:str}", status_code=202, responses=ERRORS)
async def start_build(
    template_id: str, build_id: str, data: BuildStart, ctx: ApiContext, caller: Caller
) -> None:
    """Queue the build for a builder and record it `building`; 202 at once (the SDK then
    polls the status). Queued first: a start recorded but never queued (this process dying
    between the two) would leave the build `building` for ever; queued but not recorded, the
    builder records it. The command id is the build's, so a start sent twice queues once."""
    state = await _build(ctx, caller, template_id, build_id)
    from_template, from_image = base_of(data)
    if from_image is not None and await _names_a_template(ctx, from_image):
        # `FROM base` (the E2B CLI sends a Dockerfile's FROM as an image): a bare name that
        # is one of our templates means the template, not a Docker Hub image of that name
        from_template, from_image = from_image.removesuffix(":latest"), None
    if from_image is not None and not from_image.startswith("/"):
        try:
            from_image = str(parse_reference(from_image))
        except InvalidImageReference as e:
            raise ApiError(400, str(e)) from e
    username = await _registry_login(ctx, build_id, from_image, data.from_image_registry)
    spec = bd.BuildSpec(
        from_template=from_template,
        from_image=from_image,
        from_image_username=username,
        steps=tuple(
            bd.BuildStep(
                type=s.type.upper(),
                args=tuple(s.args),
                files_hash=s.files_hash,
                force=bool(s.force),
            )
            for s in data.steps
        ),
        start_cmd=data.start_cmd or None,
        ready_cmd=data.ready_cmd or None,
        force=bool(data.force),
    )
    node = None
    if spec.from_template:
        base = await reads.template_for(ctx.engine, spec.from_template)  # `name:tag` too
        if base is not None and not base.get("capture_key"):  # durable: any node fetches it
            node = await reads.snapshot_node(ctx.engine, base["template_id"])
    start_id = sb.derived_command_id("build-start", build_id)
    cmd = bd.StartTemplateBuild(build_id=build_id, spec=spec, node_id=node, command_id=start_id)
    if not bd.decide_build(state, cmd):  # 400/409 here, before any work is queued
        return  # a retried start of the same spec
    await ctx.bus.commands.to_builder(cmd)
    await execute(ctx.bus.builds, cmd)  # nothing new if a builder was quicker


async def _log_entries(ctx: ApiContext, build_id: str, offset: int, limit: int) -> list[Any]:
    async with ctx.engine.connect() as conn:
        return await queries.build_log_entries(conn, build_id, offset, limit)


async def _templates(ctx: ApiContext, team_id: str) -> list[tuple[Any, list[Any]]]:
    async with ctx.engine.connect() as conn:
        return await queries.team_templates(conn, team_id)


async def _visible(ctx: ApiContext, template_id: str) -> bool:
    """Read-your-writes for `Sandbox.create(name)` right after a build: the templates
    read model shows what the build published (its tags: before that, `name` would still
    start the previous build), and this process's lookups of it are forgotten."""
    await fenced(ctx, template_id)
    return await reads.template(ctx.engine, template_id) is not None


def _entry(r: dict[str, Any]) -> dict[str, Any]:
    out = {"timestamp": r["at"].isoformat(), "level": r["level"], "message": r["message"]}
    if r["step"] is not None:
        out["step"] = r["step"]
    return out


@get("/templates/{template_id:str}/builds/{build_id:str}/status", responses=ERRORS)
async def build_status(
    template_id: str,
    build_id: str,
    ctx: ApiContext,
    caller: Caller,
    logs_offset: Annotated[int, Parameter(query="logsOffset", ge=0)] = 0,
    limit: Annotated[int, Parameter(ge=1, le=100)] = _LOG_PAGE,
) -> dict[str, Any]:
    """Status from the event log (always current), log lines from the read model (which
    may trail by a moment: we wait briefly for lines the build already has)."""
    state = await _build(ctx, caller, template_id, build_id)
    status = state.status.value
    if state.status is bd.BuildStatus.READY and not await _visible(ctx, template_id):
        status = bd.BuildStatus.BUILDING.value  # ready once a create would find it
    want = min(limit, max(0, state.log_count - logs_offset))
    rows = await _log_entries(ctx, build_id, logs_offset, limit)
    for _ in range(20):
        if len(rows) >= want:
            break
        await asyncio.sleep(0.05)
        rows = await _log_entries(ctx, build_id, logs_offset, limit)
    entries = [_entry(r) for r in rows]
    body: dict[str, Any] = {
        "templateID": template_id,
        "buildID": build_id,
        "status": status,
        "logEntries": entries,
        "logs": [f"{e['timestamp']} {e['message']}" for e in entries],
    }
    if state.status is bd.BuildStatus.ERROR:
        reason: dict[str, Any] = {"message": state.reason or "build failed"}
        if state.failed_step is not None:
            reason["step"] = state.failed_step
        body["reason"] = reason
    return body


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t is not None else None


def _template_body(row: dict[str, Any] | None, builds: list[dict[str, Any]]) -> dict[str, Any]:
    latest = builds[0] if builds else None
    src: dict[str, Any] = row if row is not None else builds[0]
    tid = src["template_id"]
    created = row["created_at"] if row is not None else src["requested_at"]
    updated = row["updated_at"] if row is not None else src["requested_at"]
    return {
        "templateID": tid,
        "buildID": latest["build_id"] if latest else "00000000-0000-0000-0000-000000000000",
        "cpuCount": src["cpu_count"],
        "memoryMB": src["memory_mb"],
        "diskSizeMB": src["disk_size_mb"],
        "public": tid in tp.BUILTIN_TEMPLATES,
        "aliases": [(row or {}).get("alias") or tid],
        "names": [tid],
        "createdAt": _iso(created),
        "updatedAt": _iso(updated),
        "createdBy": None,
        "lastSpawnedAt": _iso((row or {}).get("last_spawned_at")),
        "spawnCount": (row or {}).get("spawn_count", 0),
        "buildCount": len(builds),
        "envdVersion": src.get("envd_version") or ENVD_VERSION,
        "buildStatus": latest["status"] if latest is not None else "ready",
        "isDefault": tid == "base",
        # aenv's: why the last build failed, and where (E2B shows it in the build status)
        "buildReason": latest["reason"] if latest is not None else None,
        "buildStep": latest["failed_step"] if latest is not None else None,
    }


@get(["/templates", "/v2/templates"], responses=ERRORS)
async def list_templates(ctx: ApiContext, caller: Caller) -> list[dict[str, Any]]:
    return [_template_body(row, builds) for row, builds in await _templates(ctx, caller.team_id)]


@get("/templates/{template_id:str}", responses=ERRORS)
async def get_template(template_id: str, ctx: ApiContext, caller: Caller) -> dict[str, Any]:
    for row, builds in await _templates(ctx, caller.team_id):
        names = (row["template_id"], row["alias"]) if row is not None else ()
        if template_id in names or (builds and builds[0]["template_id"] == template_id):
            body = _template_body(row, builds)
            body["builds"] = [
                {
                    "buildID": b["build_id"],
                    "status": b["status"],
                    "createdAt": _iso(b["requested_at"]),
                    "updatedAt": _iso(b["updated_at"]),
                    "finishedAt": _iso(b["finished_at"]),
                    "cpuCount": b["cpu_count"],
                    "memoryMB": b["memory_mb"],
                    "diskSizeMB": b["disk_size_mb"],
                    "envdVersion": b["envd_version"] or ENVD_VERSION,
                }
                for b in builds
            ]
            for b in body["builds"]:
                if b["finishedAt"] is None:
                    del b["finishedAt"]
            return body
    raise ApiError(404, f"template '{template_id}' not found")


@get("/templates/aliases/{alias:str}", responses=ERRORS)
async def template_by_alias(alias: str, ctx: ApiContext, caller: Caller) -> dict[str, Any]:
    """`Template.exists(name)`: 200 when a template answers to the name, else 404."""
    row = await reads.template(ctx.engine, alias.split(":", 1)[0])
    if row is not None:  # the read model may trail a delete made a moment ago
        state, _ = await ctx.bus.templates.load(row["template_id"])
        row = None if state is None or state.deleted else row
    if row is None:
        raise ApiError(404, f"template alias '{alias}' not found")
    return {"templateID": row["template_id"], "public": row["template_id"] in tp.BUILTIN_TEMPLATES}


ROUTES = [
    request_build,
    file_upload_link,
    upload_files,
    start_build,
    build_status,
    list_templates,
    get_template,
    template_by_alias,
]
