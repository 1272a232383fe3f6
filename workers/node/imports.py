"""An image made into a guest image for a template on this node: a local OCI layout or
archive converted, or a registry reference pulled into the node's layer cache first (its
login, for a private registry, read from the secrets bucket by the worker)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from workers.node.image import GuestImage, build_from_oci
from workers.node.image.disk import DEFAULT_FREE
from workers.node.image.registry import RegistryAuth, parse_reference, pull
from workers.node.ports import ImageSource

__all__ = ["convert_image"]

log = logging.getLogger(__name__)


def convert_image(
    name: str,
    source: ImageSource,
    tell: Callable[[str], None] | None,
    *,
    free_bytes: int = DEFAULT_FREE,
) -> GuestImage:
    """Blocking (a thread's work): pull, unpack, convert — each step said to `tell` and
    logged. Cached by content, so an image imported again costs only the lookups. The root
    disk keeps the source's free space if it asks for one, else `free_bytes`."""
    free = free_bytes if source.free_bytes is None else source.free_bytes

    def progress(message: str) -> None:
        log.info("import %s: %s", name, message)
        if tell is not None:
            tell(message)

    if source.ref is None:
        return build_from_oci(
            Path(source.path or ""), f"tpl-{name}", progress=progress, free_bytes=free
        )
    auth = None
    if source.username is not None:
        auth = RegistryAuth(source.username, source.password or "")
    pulled = pull(parse_reference(source.ref), auth=auth, progress=progress)
    return build_from_oci(
        pulled.layout,
        f"tpl-{name}",
        progress=progress,
        ref="image",
        blobs=pulled.blobs,
        free_bytes=free,
    )
