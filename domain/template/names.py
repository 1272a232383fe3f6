"""Names of templates the platform registers for itself (not a user's, never listed).

A paused sandbox forked into children (`POST /sandboxes/{id}/fork` of a paused sandbox,
issue 32) lends its durable pause capture to a template of this name: the children are
creates of it, restored by the nodes as a persistent snapshot's children are. The capture
stays its sandbox's — its manifest goes when the sandbox is killed, never with the
template (`workers/snapshot/leftovers.py`), and a node keeps its copy of it apart from the
sandbox's own capture directory (a resume writes into that one)."""

from __future__ import annotations

__all__ = ["PAUSED_CAPTURE_PREFIX", "is_paused_capture_template", "paused_capture_template"]

#: The prefix of a paused capture's template name (the capture id follows).
PAUSED_CAPTURE_PREFIX = "paused-"


def paused_capture_template(capture_id: str) -> str:
    """The template that lends the durable pause capture `capture_id` to fork children."""
    return f"{PAUSED_CAPTURE_PREFIX}{capture_id}"


def is_paused_capture_template(name: str) -> bool:
    """Whether `name` is a paused capture's template (`paused_capture_template`)."""
    return name.startswith(PAUSED_CAPTURE_PREFIX) and len(name) > len(PAUSED_CAPTURE_PREFIX)
