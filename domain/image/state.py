"""The image aggregate's state, and the id it is kept under."""

from __future__ import annotations

import re
from typing import Annotated, Literal
from uuid import UUID

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints

from domain.errors import Invalid

__all__ = [
    "ID_PREFIX",
    "Digest",
    "Image",
    "ImageClaim",
    "ImageFailure",
    "ImageId",
    "ImageRole",
    "PublishedImage",
    "image_aggregate_id",
]

#: The prefix of an image aggregate's id: the recipe it is built from (S12's build claims
#: may bring another prefix; the pattern is widened then, never narrowed).
ID_PREFIX = "rcp-"
_ID_HEX = 40
#: An image aggregate id is a NATS subject token and a path segment: `rcp-` + 40 hex.
ImageId = Annotated[str, StringConstraints(pattern=rf"^{ID_PREFIX}[0-9a-f]{{{_ID_HEX}}}$")]
#: A disk's content digest (`shared.diskdigest.disk_digest`): sha256 hex.
Digest = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
#: What a published disk is to a VM: its root file system, or envd's runtime disk.
ImageRole = Literal["root", "runtime"]
_RECIPE = re.compile(rf"^[0-9a-f]{{{_ID_HEX},}}$")


def image_aggregate_id(recipe_digest: str) -> str:
    """The id of the aggregate that records the fleet's one build of `recipe_digest` (the
    sha256 hex of a build's inputs, `workers/node/image/cache.py::digest_of`). 160 bits of
    it are as unique as the whole, and keep the subject short."""
    if not _RECIPE.match(recipe_digest):
        raise Invalid(f"recipe digest {recipe_digest!r} is not lowercase hex of 40+ digits")
    return f"{ID_PREFIX}{recipe_digest[:_ID_HEX]}"


class ImageClaim(BaseModel):
    """One node's right to build the recipe, until its lease runs out (`until`); renewed by
    claiming again. A lease outlives a node that died mid-build only by its length."""

    model_config = ConfigDict(frozen=True)

    node_id: str
    since: AwareDatetime
    until: AwareDatetime


class PublishedImage(BaseModel):
    """The bytes the fleet runs for this recipe: the digest of one build's disk, stored in
    the snapshot repository (`image-<digest>`), and who published it."""

    model_config = ConfigDict(frozen=True)

    digest: str
    #: bytes the disk's chunks take in the repository (zero chunks are never stored)
    stored_bytes: int
    #: the disk's apparent size
    size: int
    role: ImageRole
    node_id: str | None = None
    at: AwareDatetime


class ImageFailure(BaseModel):
    """The last build that failed, kept for operators (`aenv events`), freeing the claim."""

    model_config = ConfigDict(frozen=True)

    node_id: str
    reason: str
    at: AwareDatetime


class Image(BaseModel):
    """One recipe as the fleet sees it: being built (a claim), published, or neither."""

    model_config = ConfigDict(frozen=True)

    image_id: str
    claim: ImageClaim | None = None
    published: PublishedImage | None = None
    last_failure: ImageFailure | None = None
    recent_commands: tuple[UUID, ...] = Field(default=())

    @property
    def status(self) -> Literal["empty", "claimed", "published", "failed"]:
        """`claimed` says nothing of whether the lease is still live: that needs a clock."""
        if self.published is not None:
            return "published"
        if self.claim is not None:
            return "claimed"
        return "failed" if self.last_failure is not None else "empty"

    def holder_at(self, now: AwareDatetime) -> ImageClaim | None:
        """The claim that is live at `now`, if any."""
        if self.claim is not None and self.claim.until > now:
            return self.claim
        return None

    def seen(self, command_id: UUID) -> bool:
        return command_id in self.recent_commands
