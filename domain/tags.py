"""Template tags (E2B's `name:tag`): names for builds of a template.

A template has many builds. Each successful build is captured as a template of its own, its
*capture* (id `<name>:<build id>`), which the sandboxes of that build restore: a rebuild
never touches an older build's capture. A tag names one build of the template — `default`
the latest successful one (what `Sandbox.create(name)` starts), others what a build was
asked to be called (`Template.build(t, "name:v1")`) or what a user pointed them at later
(`Template.assign_tags("name:v1", "stable")`).

A capture is kept while some tag names it. When none does any more it is *released*: the
template records since when, and the API drops it from every node once a grace period has
passed (a create that resolved the tag a moment before still finds it), then records the
drop. Templates from before tags existed — and snapshots, image imports, `base` — have no
tags: their `default` is their own capture, under their own id.

Pure rules only; the template aggregate (`domain/template/`) decides and folds with them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from pydantic import AwareDatetime, BaseModel, ConfigDict

from domain.errors import Invalid

__all__ = [
    "DEFAULT_TAG",
    "IMAGE_TEMPLATE_PREFIX",
    "TaggedBuild",
    "build_capture_id",
    "candidates",
    "captures",
    "normalize_tags",
    "released_by",
    "shown_template",
    "split_capture_id",
    "valid_tag",
]

#: How the template an image is imported as begins (`shared.images.image_template_id`).
IMAGE_TEMPLATE_PREFIX = "img-"

#: The tag every successful build takes: the build `Sandbox.create(name)` starts.
DEFAULT_TAG = "default"

#: E2B's tag alphabet (infra `id.ValidateAndDeduplicateTags`), bounded like a template name.
_TAG = re.compile(r"^[a-z0-9._-]{1,128}$")
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


class TaggedBuild(BaseModel):
    """What a tag names: a build (None: a template's own capture from before tags, whose
    build the template never recorded) and the capture its sandboxes restore."""

    model_config = ConfigDict(frozen=True)

    build_id: str | None
    capture_id: str
    #: when the tag was pointed here (None: the implicit `default` of an untagged template)
    at: AwareDatetime | None = None

    def same_build(self, other: TaggedBuild | None) -> bool:
        return other is not None and (other.build_id, other.capture_id) == (
            self.build_id,
            self.capture_id,
        )


def valid_tag(tag: str) -> bool:
    """E2B refuses tags that are UUIDs: `name:<build id>` names a build's capture."""
    return bool(_TAG.match(tag)) and not _UUID.match(tag)


def normalize_tags(raw: Iterable[str]) -> tuple[str, ...]:
    """Lowercased, trimmed, each once (first occurrence's order); a bad tag is `Invalid`."""
    out: list[str] = []
    for tag in raw:
        clean = tag.strip().lower()
        if not valid_tag(clean):
            raise Invalid(f"invalid tag {tag!r}: use a-z, 0-9, '.', '_', '-' (not a UUID)")
        if clean not in out:
            out.append(clean)
    return tuple(out)


def build_capture_id(template_id: str, build_id: str) -> str:
    """The template a build's capture is registered as (a subject token: no `.` in a UUID)."""
    return f"{template_id}:{build_id}"


def split_capture_id(template_id: str) -> tuple[str, str] | None:
    """(template, build) of a build's capture id; None for any other template id."""
    name, sep, build = template_id.rpartition(":")
    return (name, build) if sep and name and _UUID.match(build) else None


def shown_template(template_id: str, alias: str | None = None) -> str:
    """The template id E2B shows for a sandbox: its template's, not its build's capture;
    for a sandbox of an image (template `img-…`) the reference it was created by, its
    `alias` — what the client sent, so its SDK shows what it asked for."""
    if alias and template_id.startswith(IMAGE_TEMPLATE_PREFIX):
        return alias
    split = split_capture_id(template_id)
    return split[0] if split is not None else template_id


def candidates(ref: str) -> list[tuple[str, str]]:
    """Where `ref` may point, in order: a template of exactly that id (a snapshot's
    `name:tag` id, a build's capture) at `default`, then `name` at tag `tag`. A `:` that
    precedes a `/` is a registry's port (`127.0.0.1:5000/cat/a:1`), not a tag: such a
    reference is no `name:tag` and is looked up whole (then as an image, by the API)."""
    out = [(ref, DEFAULT_TAG)]
    name, sep, tag = ref.partition(":")
    if sep and name and tag and "/" not in tag:
        out.append((name, tag))
    return out


def captures(tags: Mapping[str, TaggedBuild]) -> set[str]:
    return {t.capture_id for t in tags.values()}


def released_by(
    before: Mapping[str, TaggedBuild], after: Mapping[str, TaggedBuild]
) -> tuple[str, ...]:
    """The captures a tag change leaves unnamed (sorted: a decision is deterministic)."""
    return tuple(sorted(captures(before) - captures(after)))
