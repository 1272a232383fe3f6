"""The refusals a node acts on: each carries what the node needs to know next, so it never
parses a message (wait for the holder until its lease runs out; fetch the published bytes)."""

from __future__ import annotations

from datetime import datetime

from domain.errors import Conflict

__all__ = ["AlreadyPublished", "ClaimHeld"]


class ClaimHeld(Conflict):
    """Another node is building the recipe: wait for its `ImagePublished` or
    `ImageBuildFailed`, or for `until`, when its lease runs out and a claim is granted."""

    def __init__(self, image_id: str, holder: str, until: datetime) -> None:
        super().__init__(
            f"image {image_id} is being built by node {holder} (its lease runs out at "
            f"{until.isoformat()})"
        )
        self.image_id = image_id
        self.holder = holder
        self.until = until


class AlreadyPublished(Conflict):
    """The recipe is built already: its bytes are `digest`. A build of the same recipe that
    produced other bytes (builds are not byte-reproducible) is not what the fleet runs."""

    def __init__(self, image_id: str, digest: str) -> None:
        super().__init__(f"image {image_id} is published as {digest}")
        self.image_id = image_id
        self.digest = digest
