"""What an image-first create left behind, read the same way by the VM-less and the e2e
tiers: the imports in the event log and the node's build counter."""

from __future__ import annotations

import asyncio

from bus import Bus, BusSettings
from domain import template as tp
from shared.images import image_template_id
from tests.series import node_url, scrape

__all__ = ["builds_counted", "imports_in_log"]


def imports_in_log(settings: BusSettings, image: str) -> int:
    """TemplateImported events of the template `image` is imported as."""

    async def read() -> int:
        bus = await Bus.connect(settings, setup=False)
        try:
            recs = await bus.templates.read(image_template_id(image))
            return sum(isinstance(r.event, tp.TemplateImported) for r in recs)
        finally:
            await bus.close()

    return asyncio.run(read())


def builds_counted(settings: BusSettings, node: str, token: str) -> float:
    """The node's `aenv_image_builds_total`, scraped with the stack's metrics token."""
    samples = scrape(node_url(settings, node), token)
    return samples.get(("aenv_image_builds_total", frozenset({("node", node)})), 0.0)
