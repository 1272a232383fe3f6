"""Image-first creates: a registry reference where a template goes.

RL frameworks that speak E2B's API name the task's image as the template
(`Sandbox.create("127.0.0.1:5000/cat/a:1")`) or in the create's metadata (under
`aenv.image`, `shared.images.IMAGE_METADATA_KEY`). Such a create starts a sandbox of that
image: imported on its first use as template `img-<hash>` (`shared.images.image_template_id`,
the name a template build FROM the image uses too), then restored from that template's
capture like any other create.

Concurrent first uses of one image send the same `ImportTemplateImage`: its command id is
derived from the template and the log's position on its subject, so JetStream's `Nats-Msg-Id`
dedup stores it once and one node imports it, while every request waits for the same
`TemplateImported`. A request cut off by its client's timeout leaves the import going (it is
a command on the bus, not work of the request); a retried create finds it under way and
joins it, or finds the template made. After a failed import the position has moved (the
rejection is on the subject), so a later create tries again with a new command id.

JetStream's dedup holds for its duplicate window: creates further apart than that while
the first import still runs send a second import of the template (a second
`TemplateImported`), and other references to the same manifest (another tag, a digest)
are templates of their own. None of these builds the image again: an import's recipe is
the registry's manifest digest, and the fleet builds each recipe once (images-at-scale S5:
the claim's winner pulls and converts, every other node fetches its bytes).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

from api import reads
from api.auth import Caller
from api.context import ApiContext
from api.errors import ApiError
from api.outcomes import REJECTION_STATUS
from bus.envelope import MessageContext
from bus.subjects import carries
from domain import CommandRejected
from domain import sandbox as sb
from domain import template as tp
from projections import ProjectionTimeout
from shared.images import (
    IMAGE_METADATA_KEY,
    InvalidImageReference,
    image_template_id,
    looks_like_image,
    parse_reference,
)

__all__ = ["asked_image", "check_template_name", "image_template", "looks_like_image"]


def check_template_name(template_id: str) -> None:
    """400 for a template id no template can have: one the bus cannot carry (`*`, `>`,
    whitespace), so nothing of it could ever have been stored."""
    if not carries(template_id):
        raise ApiError(
            400, f"invalid template id {template_id!r}: '*', '>' and whitespace are not allowed"
        )


def asked_image(metadata: Mapping[str, str] | None) -> str | None:
    """The image a create's metadata names (None: it names none); 400 if not a reference."""
    image = (metadata or {}).get(IMAGE_METADATA_KEY)
    if image is None:
        return None
    try:
        parse_reference(image)
    except InvalidImageReference as e:
        raise ApiError(400, f"metadata {IMAGE_METADATA_KEY}: {e}") from e
    return image


async def image_template(ctx: ApiContext, image: str, caller: Caller) -> dict[str, Any]:
    """The template row a create of `image` starts from (imported first if it never was),
    under `image` as its alias: the sandbox's `templateID` is the reference as sent."""
    template_id = image_template_id(image)
    tpl: reads.Row | None = await ctx.cached(
        f"tpl:{template_id}", lambda: reads.template_for(ctx.engine, template_id)
    )
    if tpl is None:
        ctx.forget(f"tpl:{template_id}")
        seq = await _imported(ctx, image, template_id, caller)
        with contextlib.suppress(ProjectionTimeout):  # read below; None is answered 503
            await ctx.wait_for_templates(seq)
        tpl = await reads.template_for(ctx.engine, template_id)
    if tpl is None:
        raise ApiError(503, f"image {image} was imported as {template_id}; not readable yet: retry")
    return {**tpl, "alias": image}


async def _imported(ctx: ApiContext, image: str, template_id: str, caller: Caller) -> int:
    """Import `image` as `template_id`, or join the import under way; the log's sequence
    of the template once it is there."""
    state, version = await ctx.bus.templates.load(template_id)
    if state is not None and not state.deleted:
        return version.seq  # imported; the read model had not caught up
    cmd = tp.ImportTemplateImage(
        template_id=template_id,
        image_ref=str(parse_reference(image)),
        # the same for every create that looked at the same log: one import (see above)
        command_id=sb.derived_command_id("image-first", template_id, str(version.seq)),
    )
    timeout = ctx.settings.image_create_timeout_s
    waiter = asyncio.create_task(
        ctx.bus.templates.wait_for_outcome(
            template_id, cmd.command_id, version.seq, (tp.TemplateImported,), timeout
        )
    )
    try:
        await asyncio.sleep(0)  # watching before the command can be answered
        await ctx.bus.commands.to_placement(cmd, context=MessageContext(actor=caller.key_id))
        rec = await waiter
    finally:
        waiter.cancel()
    if rec is None:
        raise ApiError(
            504,
            f"image {image} is still being imported after {timeout:.0f}s; the import goes "
            "on: retry the create later",
        )
    if isinstance(rec.event, CommandRejected):
        status = REJECTION_STATUS.get(rec.event.code, 400)
        raise ApiError(status, f"image {image} could not be imported: {rec.event.reason}")
    return rec.seq
