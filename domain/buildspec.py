"""What a template build builds (`BuildSpec`, E2B's wire shape of the steps) and its
fingerprint: the digest of everything that determines the result, so that identical builds
of one template racing each other can be one build (`domain.buildkey`)."""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["STEP_TYPES", "BuildSpec", "BuildStep", "forced", "spec_fingerprint"]

#: Instructions a build runs. Anything else is accepted into the spec (so the build, not the
#: request, fails with the step named), as E2B reports a bad step through the build status.
STEP_TYPES = frozenset({"RUN", "COPY", "ENV", "WORKDIR", "USER", "ARG"})

#: Bumped when what a build does with the same inputs changes (the builder's steps learn
#: something new): a build of the old meaning is never shared with one of the new.
FINGERPRINT_VERSION = 1


class BuildStep(BaseModel):
    """One instruction, in E2B's wire shape (`type`, `args`, `filesHash` for COPY)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: str = Field(min_length=1, max_length=32)
    args: tuple[str, ...] = ()
    files_hash: str | None = None
    force: bool = False


class BuildSpec(BaseModel):
    """What to build: a base (an existing template, or an image the node can convert) and
    the steps on top; `start_cmd` runs in the background before the snapshot, `ready_cmd`
    must then succeed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    from_template: str | None = None
    from_image: str | None = None
    #: a private registry's username for `from_image`; its password is kept beside the log
    #: (the secrets bucket, under the build id) and never in it
    from_image_username: str | None = None
    steps: tuple[BuildStep, ...] = ()
    start_cmd: str | None = None
    ready_cmd: str | None = None
    #: E2B's `force` (`skip_cache`): nothing cached is reused, a FROM image is pulled again
    force: bool = False


def forced(spec: BuildSpec) -> bool:
    """A build that asked for nothing to be reused (E2B's `force`, of the build or a step)."""
    return spec.force or any(step.force for step in spec.steps)


def spec_fingerprint(
    *,
    team_id: str | None,
    template_id: str,
    base: str,
    spec: BuildSpec,
    cpu_count: int,
    memory_mb: int,
    disk_size_mb: int,
) -> str | None:
    """sha256 over canonical JSON of what a build's result depends on; None for a forced
    build, which is never shared with another.

    `base` is the resolved base, which the caller reads from the log (the capture a
    `from_template` names now, an image file's identity): two builds FROM `base` either side
    of a rebuild of `base` are different builds. COPY steps are named by their files' hash,
    so the same step over other files is another build. Tags are not in it: a build that
    joins another takes its own tags onto the shared result."""
    if forced(spec):
        return None
    doc = {
        "v": FINGERPRINT_VERSION,
        "team": team_id,
        "template": template_id,
        "base": base,
        "from_template": spec.from_template,
        "from_image": spec.from_image,
        "from_image_username": spec.from_image_username,
        "steps": [[s.type, list(s.args), s.files_hash] for s in spec.steps],
        "start_cmd": spec.start_cmd,
        "ready_cmd": spec.ready_cmd,
        "resources": [cpu_count, memory_mb, disk_size_mb],
    }
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()
