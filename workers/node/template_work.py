"""The template work a node does: an image made into a template (`ImportTemplateImage`:
pulled or read, converted, booted once and captured here, then registered and answered on
the template's subject), and where a template captured on another node is durable."""

from __future__ import annotations

import logging

from bus import Bus, MessageContext, PermanentError
from bus.decisions import execute
from bus.secrets import SecretBox
from domain import template as tp
from envd.version import ENVD_VERSION
from workers.node.buildlog import BuildLog
from workers.node.completions import completion_id
from workers.node.ports import Host, HostError, ImageSource, TemplateLocation

__all__ = ["import_failure_code", "import_template", "locate_template"]

log = logging.getLogger(__name__)


async def import_template(
    bus: Bus, host: Host, node_id: str, cmd: tp.ImportTemplateImage, ctx: MessageContext
) -> None:
    """An image becomes a template on this node, then registered and answered."""
    name = cmd.template_id
    source = await _image_source(bus, cmd)
    async with BuildLog(bus, cmd.build_id, ctx) as build_log:
        try:
            image = await host.import_image(
                name, source, vcpus=cmd.cpu_count, mem_mib=cmd.memory_mb, progress=build_log.line
            )
        except Exception as e:
            # the consumer answers it on the template's subject, where the requester waits
            log.exception("import of %s as %s failed", source, name)
            raise PermanentError(f"image {source}: {e}", code=import_failure_code(e)) from e
    register = tp.RegisterTemplate(
        template_id=name,
        alias=cmd.alias,
        envd_version=ENVD_VERSION,
        cpu_count=cmd.cpu_count,
        memory_mb=cmd.memory_mb,
        disk_size_mb=image.disk_size_mb,
        command_id=completion_id(cmd, "registered"),
    )
    await execute(bus.templates, register, ctx)
    # the answer the requester waits for: after the registration
    done = tp.CompleteTemplateImport(
        template_id=name,
        image_digest=image.digest,
        node_id=node_id,
        command_id=completion_id(cmd, "imported"),
    )
    await execute(bus.templates, done, ctx)


def import_failure_code(e: Exception) -> str:
    """The rejection code of a failed import: a full node disk is the node's fault, not
    the image's — `unavailable` (503: try again, another node may have room); anything
    else is the image's, `permanent`."""
    if isinstance(e, HostError) and e.code == "unavailable":
        return "unavailable"
    return "permanent"


async def _image_source(bus: Bus, cmd: tp.ImportTemplateImage) -> ImageSource:
    """Where the image comes from; a private registry's login from the secrets bucket
    (the command names it, the log never holds it)."""
    free = None if cmd.disk_free_mb is None else cmd.disk_free_mb << 20
    if cmd.credentials is None:
        return ImageSource(path=cmd.image_path, ref=cmd.image_ref, free_bytes=free)
    box = await SecretBox.open(bus.js, bus.names.secrets_bucket)
    login = await box.get(cmd.credentials)
    if login is None:
        raise PermanentError(
            f"image {cmd.image}: its registry login is gone (kept "
            f"{bus.settings.secret_ttl_s:.0f} s): start the build "
            "again"
        )
    return ImageSource(
        ref=cmd.image_ref,
        username=str(login.get("username", "")),
        password=str(login.get("password", "")),
        free_bytes=free,
    )


async def locate_template(bus: Bus, name: str) -> TemplateLocation | None:
    """Where the log says a template captured elsewhere is durable, with the envd token
    its captured guest holds: its source sandbox's for a snapshot (a build's too), none
    for an imported image (`capture_of` None: no sandbox was its source)."""
    tpl, _ = await bus.templates.load(name)
    if tpl is None or tpl.deleted or tpl.capture_key is None:
        return None
    if tpl.capture_of is None:
        return tpl.capture_key, None, None
    source, _ = await bus.sandboxes.load(tpl.capture_of)
    token = source.envd_access_token if source is not None else None
    return tpl.capture_key, token, tpl.capture_of
