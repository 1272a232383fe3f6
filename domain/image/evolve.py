"""`evolve_image` and `fold_image`: a recipe's image state from its events."""

from __future__ import annotations

from collections.abc import Iterable
from functools import reduce
from typing import assert_never

from domain.errors import CorruptHistory
from domain.image.events import (
    IMAGE_EVENTS,
    AnyImageEvent,
    ImageBuildClaimed,
    ImageBuildFailed,
    ImageEvent,
    ImageForgotten,
    ImagePublished,
)
from domain.image.state import Image, ImageClaim, ImageFailure, PublishedImage
from domain.messages import CommandRejected, Event

__all__ = ["evolve_image", "fold_image"]

#: Command ids remembered for idempotency: a retry comes soon after the original.
_RECENT = 16


def evolve_image(state: Image | None, event: Event) -> Image | None:
    if isinstance(event, CommandRejected):
        return state
    if not isinstance(event, IMAGE_EVENTS):
        raise CorruptHistory(f"not an image event: {type(event).__name__}")
    after = _evolve(state, event)
    return after.model_copy(
        update={"recent_commands": (*after.recent_commands, event.command_id)[-_RECENT:]}
    )


def _evolve(state: Image | None, event: AnyImageEvent) -> Image:
    match event:
        case ImageBuildClaimed():
            s = state or Image(image_id=event.image_id)
            renewed = s.claim is not None and s.claim.node_id == event.node_id
            since = s.claim.since if s.claim is not None and renewed else event.at
            claim = ImageClaim(node_id=event.node_id, since=since, until=event.until)
            return s.model_copy(update={"claim": claim})
        case ImagePublished():
            s = state or Image(image_id=event.image_id)
            published = PublishedImage(
                digest=event.digest,
                stored_bytes=event.stored_bytes,
                size=event.size,
                role=event.role,
                node_id=event.node_id,
                at=event.at,
            )
            return s.model_copy(update={"published": published, "claim": None})
        case ImageBuildFailed():
            s = _existing(state, event)
            failure = ImageFailure(node_id=event.node_id, reason=event.reason, at=event.at)
            return s.model_copy(update={"claim": None, "last_failure": failure})
        case ImageForgotten():
            s = _existing(state, event)
            return Image(image_id=s.image_id, recent_commands=s.recent_commands)
        case _:
            assert_never(event)


def _existing(state: Image | None, event: ImageEvent) -> Image:
    if state is None:
        raise CorruptHistory(
            f"{type(event).__name__} of image {event.image_id} that was never claimed"
        )
    return state


def fold_image(events: Iterable[Event], state: Image | None = None) -> Image | None:
    return reduce(evolve_image, events, state)
