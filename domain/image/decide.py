"""`decide_image`: the fleet's one build of a recipe — who builds it, and what it is."""

from __future__ import annotations

from datetime import timedelta
from typing import assert_never

from domain.image.commands import (
    AnyImageCommand,
    ClaimImageBuild,
    FailImageBuild,
    ForgetImage,
    PublishImage,
)
from domain.image.errors import AlreadyPublished, ClaimHeld
from domain.image.events import ImageBuildClaimed, ImageBuildFailed, ImageForgotten, ImagePublished
from domain.image.state import Image
from domain.messages import Event

__all__ = ["decide_image"]


def decide_image(state: Image | None, command: AnyImageCommand) -> list[Event]:
    """A command already accepted decides nothing (a retried one appends nothing new).

    - Claim: refused with `AlreadyPublished(digest)` once the recipe is published, and
      with `ClaimHeld(holder, until)` while another node's lease is live (`until` after
      the command's `at`). The holder claiming again renews; a lease run out is anyone's.
    - Publish: allowed from any node while nothing is published, claim or not, and after
      a failure. Images are content-addressed: a node whose lease ran out while it built
      uploaded real bytes under their own digest, and the fleet may as well run them
      rather than build again; the claim, whoever holds it, ends with the publish. Once
      published, the first digest stays: publishing it again decides nothing, another
      digest is refused with `AlreadyPublished(first)`, so the late builder switches to
      the fleet's bytes (two builds of one recipe differ, and captures must name the
      bytes every node fetches).
    - Fail: frees the claim when the failing node holds it (live or run out); from a
      node that lost the claim, or after the publish, it is moot.
    - Forget: back to empty (its published digest named, for the repository's janitor);
      refused with `ClaimHeld` while a node builds it, so a forget never lets a second
      build start beside a live one.
    """
    if state is not None and state.seen(command.command_id):
        return []
    iid, at, cid = command.image_id, command.at, command.command_id
    match command:
        case ClaimImageBuild():
            if state is not None and state.published is not None:
                raise AlreadyPublished(iid, state.published.digest)
            live = state.holder_at(at) if state is not None else None
            if live is not None and live.node_id != command.node_id:
                raise ClaimHeld(iid, live.node_id, live.until)
            until = at + timedelta(seconds=command.lease_s)
            return [
                ImageBuildClaimed(
                    image_id=iid, command_id=cid, node_id=command.node_id, until=until, at=at
                )
            ]
        case PublishImage():
            if state is not None and state.published is not None:
                if state.published.digest == command.digest:
                    return []
                raise AlreadyPublished(iid, state.published.digest)
            return [
                ImagePublished(
                    image_id=iid,
                    command_id=cid,
                    digest=command.digest,
                    stored_bytes=command.stored_bytes,
                    size=command.size,
                    role=command.role,
                    node_id=command.node_id,
                    at=at,
                )
            ]
        case FailImageBuild():
            if state is None or state.published is not None or state.claim is None:
                return []
            if state.claim.node_id != command.node_id:
                return []  # a node whose lease ran out and was taken over
            return [
                ImageBuildFailed(
                    image_id=iid,
                    command_id=cid,
                    node_id=command.node_id,
                    reason=command.reason,
                    at=at,
                )
            ]
        case ForgetImage():
            if state is None or state.status == "empty":
                return []
            live = state.holder_at(at)
            if live is not None:
                raise ClaimHeld(iid, live.node_id, live.until)
            digest = state.published.digest if state.published is not None else None
            return [ImageForgotten(image_id=iid, command_id=cid, digest=digest, at=at)]
        case _:
            assert_never(command)
