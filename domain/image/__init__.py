"""The image aggregate: the fleet's one build of a recipe (design: images-at-scale S5).

Builds are not byte-reproducible (two mkfs runs of one tree differ), so an image's identity
is the digest of the bytes one build produced, and the fleet builds each recipe once: a
node claims the build for a lease, builds, uploads the disk to the snapshot repository and
publishes its digest; every other node fetches those bytes. One aggregate per recipe, id
`rcp-<recipe digest[:40]>` (`image_aggregate_id`), on `aenv.evt.image.<id>`.
"""

from domain.image.commands import *  # noqa: F403
from domain.image.commands import __all__ as _commands
from domain.image.decide import decide_image
from domain.image.errors import AlreadyPublished, ClaimHeld
from domain.image.events import *  # noqa: F403
from domain.image.events import __all__ as _events
from domain.image.evolve import evolve_image, fold_image
from domain.image.state import (
    Image,
    ImageClaim,
    ImageFailure,
    ImageId,
    ImageRole,
    PublishedImage,
    image_aggregate_id,
)

__all__ = [
    *_commands,
    *_events,
    "AlreadyPublished",
    "ClaimHeld",
    "Image",
    "ImageClaim",
    "ImageFailure",
    "ImageId",
    "ImageRole",
    "PublishedImage",
    "decide_image",
    "evolve_image",
    "fold_image",
    "image_aggregate_id",
]
