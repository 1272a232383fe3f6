"""The image aggregate's commands: what nodes ask of the fleet's one build of a recipe."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from domain.image.state import Digest, ImageId, ImageRole
from domain.messages import Command

__all__ = [
    "DEFAULT_LEASE_S",
    "AnyImageCommand",
    "ClaimImageBuild",
    "FailImageBuild",
    "ForgetImage",
    "ImageCommand",
    "PublishImage",
]

#: How long a claim holds without being renewed: longer than a debootstrap or a large
#: import takes on a loaded node, short enough that a node that died mid-build delays the
#: others by at most this. A builder renews well before it runs out.
DEFAULT_LEASE_S = 900


class ImageCommand(Command):
    """A command addressed to one image aggregate (`image_aggregate_id(recipe)`). `at` is
    the issuer's clock and the only "now" `decide` knows: a lease is live while its
    `until` is after the deciding command's `at`."""

    aggregate: ClassVar[str] = "image"
    aggregate_field: ClassVar[str] = "image_id"

    image_id: ImageId


class ClaimImageBuild(ImageCommand):
    """`node_id` asks to build the recipe, for `lease_s` seconds from `at`; the holder
    claiming again renews its lease."""

    node_id: str = Field(min_length=1)
    lease_s: int = Field(default=DEFAULT_LEASE_S, ge=1, le=86_400)


class PublishImage(ImageCommand):
    """The recipe's bytes are in the repository as `image-<digest>`: the fleet runs them."""

    digest: Digest
    stored_bytes: int = Field(ge=0)
    size: int = Field(ge=0)
    role: ImageRole
    #: the node that built and uploaded it (None: published on no node's behalf)
    node_id: str | None = None


class FailImageBuild(ImageCommand):
    """The claim holder's build failed: the claim is freed, so another node may try."""

    node_id: str = Field(min_length=1)
    reason: str = Field(min_length=1, max_length=4000)


class ForgetImage(ImageCommand):
    """No template or capture names the recipe's bytes any more (S11's janitor): the record
    goes back to empty, and the next use builds it again."""


#: The closed set of image commands (`decide_image` matches it exhaustively).
AnyImageCommand = ClaimImageBuild | PublishImage | FailImageBuild | ForgetImage
