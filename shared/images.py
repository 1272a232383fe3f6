"""How container images are named: a reference, normalised the way Docker does it
(`busybox` is `docker.io/library/busybox:latest`). Pure; used by the API (to refuse a bad
reference with a 400), the template builder and the node that pulls."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from domain.tags import IMAGE_TEMPLATE_PREFIX

__all__ = [
    "DOCKER_HUB",
    "IMAGE_METADATA_KEY",
    "ImageRef",
    "InvalidImageReference",
    "image_template_id",
    "looks_like_image",
    "mirrored",
    "parse_mirrors",
    "parse_reference",
]

DOCKER_HUB = "docker.io"
#: The create metadata key that names a sandbox's image (for frameworks that keep the task's
#: image in the create's metadata rather than in `templateID`; docs/templates.md).
IMAGE_METADATA_KEY = "aenv.image"
_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST = re.compile(r"^[a-z0-9]+(?:[+._-][a-z0-9]+)*:[a-fA-F0-9]{32,}$")
_LOOPBACK = re.compile(r"^(localhost|127(?:\.\d{1,3}){3}|\[::1\])(?::\d+)?$")


class InvalidImageReference(ValueError):
    """Not a reference an OCI registry could serve."""


@dataclass(frozen=True)
class ImageRef:
    registry: str  # host[:port]; docker.io for Docker Hub
    repository: str  # e.g. library/busybox
    tag: str | None = None
    digest: str | None = None

    def __str__(self) -> str:
        suffix = f"@{self.digest}" if self.digest else f":{self.tag or 'latest'}"
        return f"{self.registry}/{self.repository}{suffix}"

    @property
    def transport(self) -> str:
        return f"docker://{self}"

    @property
    def loopback(self) -> bool:
        return bool(_LOOPBACK.match(self.registry))


def parse_reference(text: str) -> ImageRef:
    """`name[:tag][@digest]` with Docker's defaults: no registry host means Docker Hub, a
    one-part Docker Hub name lives under `library/`, no tag means `latest`."""
    raw = text.strip()
    if not raw or any(c.isspace() for c in raw) or "://" in raw:
        raise InvalidImageReference(f"invalid image reference {text!r}")
    name, _, digest = raw.partition("@")
    tag = None
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = name.rsplit(":", 1)
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        registry, path = first, rest
    else:
        registry, path = DOCKER_HUB, name
    if registry in ("index.docker.io", "registry-1.docker.io"):
        registry = DOCKER_HUB
    if registry == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    if not path or not all(_COMPONENT.match(c) for c in path.split("/")):
        raise InvalidImageReference(f"invalid image reference {text!r}: bad repository {path!r}")
    if tag is not None and not _TAG.match(tag):
        raise InvalidImageReference(f"invalid image reference {text!r}: bad tag {tag!r}")
    if digest and not _DIGEST.match(digest):
        raise InvalidImageReference(f"invalid image reference {text!r}: bad digest {digest!r}")
    return ImageRef(registry, path, tag if tag or digest else "latest", digest or None)


def image_template_id(image: str, username: str | None = None) -> str:
    """The template a registry image becomes when it is imported as-is (a create that names
    it, a template build FROM it): one name for the API and the builder, so both find one
    import. Keyed by the normalised reference (`python:3.12` and
    `docker.io/library/python:3.12` are one image) and the login pulled with, since two
    logins may see different images. A subject token: `img-` and hex, no `.`."""
    ref = str(parse_reference(image))
    key = hashlib.sha256(f"registry|{ref}|{username or ''}".encode()).hexdigest()
    return f"{IMAGE_TEMPLATE_PREFIX}{key[:16]}"


def looks_like_image(text: str) -> bool:
    """Whether a create's `templateID` that names no template is meant as an image: it
    has a `/` or an `@` (no template name, `name:tag` or capture id does) and parses as a
    reference. `python:3.12` does not qualify (a template `python`, tag `3.12`): its
    registry form, `docker.io/library/python:3.12`, does."""
    if "/" not in text and "@" not in text:
        return False
    try:
        parse_reference(text)
    except InvalidImageReference:
        return False
    return True


_HOST = re.compile(r"^(?:[A-Za-z0-9.-]+|\[[0-9a-fA-F:]+\])(?::\d{1,5})?$")


def parse_mirrors(text: str) -> dict[str, str]:
    """`registry=mirror[,registry=mirror…]` (`docker.io=hub-cache.internal:5000`): the
    registries whose images are pulled from a mirror instead — a pull-through cache, or the
    only way out of an air-gapped fleet. Docker's names are normalised (`index.docker.io`
    is `docker.io`)."""
    mirrors: dict[str, str] = {}
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        registry, sep, mirror = (part.strip() for part in item.partition("="))
        if not sep or not _HOST.match(registry) or not _HOST.match(mirror):
            raise InvalidImageReference(f"bad registry mirror {item!r}: want registry=host[:port]")
        if registry in ("index.docker.io", "registry-1.docker.io"):
            registry = DOCKER_HUB
        mirrors[registry] = mirror
    return mirrors


def mirrored(ref: ImageRef, mirrors: Mapping[str, str]) -> ImageRef:
    """Where `ref` is pulled from: the same repository on its registry's mirror, if any.
    No fallback to the registry itself: a mirror is configured because that one is not to
    be reached."""
    mirror = mirrors.get(ref.registry)
    return ref if mirror is None else replace(ref, registry=mirror)
