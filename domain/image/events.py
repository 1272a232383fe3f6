"""The image aggregate's events: the closed set `evolve_image` folds."""

from __future__ import annotations

from uuid import UUID

from pydantic import AwareDatetime

from domain.image.state import ImageRole
from domain.messages import Event

__all__ = [
    "IMAGE_EVENTS",
    "AnyImageEvent",
    "ImageBuildClaimed",
    "ImageBuildFailed",
    "ImageEvent",
    "ImageForgotten",
    "ImagePublished",
]


class ImageEvent(Event):
    image_id: str
    command_id: UUID


class ImageBuildClaimed(ImageEvent):
    """`node_id` builds the recipe until `until` (a renewal when it held the claim)."""

    node_id: str
    until: AwareDatetime


class ImagePublished(ImageEvent):
    digest: str
    stored_bytes: int
    size: int
    role: ImageRole
    node_id: str | None = None


class ImageBuildFailed(ImageEvent):
    node_id: str
    reason: str


class ImageForgotten(ImageEvent):
    #: the bytes it had published (None: it was only claimed or failed): S11's janitor
    #: deletes `image-<digest>` from the repository
    digest: str | None = None


AnyImageEvent = ImageBuildClaimed | ImagePublished | ImageBuildFailed | ImageForgotten
IMAGE_EVENTS = (ImageBuildClaimed, ImagePublished, ImageBuildFailed, ImageForgotten)
