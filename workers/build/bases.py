"""What a build starts from, read from the log: the template a `FROM name[:tag]` names, and
the identity of a build's base that its fingerprint takes (so that builds either side of a
rebuild of their base are never shared)."""

from __future__ import annotations

from pathlib import Path

from bus import Bus
from domain import build as bd
from domain import tags as tg
from domain import template as tp

__all__ = ["base_identity", "base_template"]


async def base_template(bus: Bus, ref: str) -> tp.Template | None:
    """The template a build FROM `ref` starts from: `name[:tag]` is the build the tag
    names (its capture), as for a create; a snapshot's or an image's, itself."""
    for template_id, tag in tg.candidates(ref):
        state, _ = await bus.templates.load(template_id)
        if state is None or state.deleted:
            continue
        capture = state.capture_for(tag)
        if capture is None or capture == state.template_id:
            return state if capture is not None else None
        found, _ = await bus.templates.load(capture)
        return found if found is not None and not found.deleted else None
    return None


async def base_identity(bus: Bus, spec: bd.BuildSpec) -> str:
    """The base as it is now: the capture a `from_template` names (the name itself when it
    names nothing: the build fails the same either way), an image file by its size and
    modification time, a registry reference as written (Docker reuses a pulled tag too,
    until a build forces it)."""
    if spec.from_image is None:
        ref = spec.from_template or "base"
        found = await base_template(bus, ref)
        return f"template:{found.template_id if found is not None else ref}"
    path = Path(spec.from_image)
    if path.is_absolute():
        try:
            st = path.stat()
        except OSError:
            return f"file:{path}|missing"
        return f"file:{path}|{st.st_size}|{st.st_mtime_ns}"
    return f"image:{spec.from_image}"
