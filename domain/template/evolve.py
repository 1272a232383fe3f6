"""`evolve_template` and `fold_template`: a template's state from its events."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from functools import reduce
from typing import assert_never

from domain.errors import CorruptHistory
from domain.messages import CommandRejected, Event
from domain.tags import TaggedBuild, captures
from domain.template.events import (
    TEMPLATE_EVENTS,
    AnyTemplateEvent,
    TemplateBuildPublished,
    TemplateCaptureDropped,
    TemplateDeleted,
    TemplateImported,
    TemplateRegistered,
    TemplateTagsAssigned,
    TemplateTagsRemoved,
    TemplateUploaded,
)
from domain.template.state import Template

__all__ = ["evolve_template", "fold_template"]


def evolve_template(state: Template | None, event: Event) -> Template | None:
    if isinstance(event, CommandRejected):
        return state
    if not isinstance(event, TEMPLATE_EVENTS):
        raise CorruptHistory(f"not a template event: {type(event).__name__}")
    return _evolve_template(state, event)


def _evolve_template(state: Template | None, event: AnyTemplateEvent) -> Template | None:
    match event:
        case TemplateRegistered():
            fresh = Template(**event.model_dump(exclude={"at"}))
            if state is None:
                return fresh
            kept = {"released": state.released, "tags": {} if state.deleted else state.tags}
            return fresh.model_copy(update=kept)
        case TemplateImported():
            # registered by the TemplateRegistered before it; where its capture is
            if state is None:  # (a history without its registration: nothing to place)
                return state
            return state.model_copy(update={"imported_on": event.node_id})
        case TemplateDeleted():
            s = _retagged(_existing(state, event), {}, event.released, event.at)
            return s.model_copy(update={"deleted": True})
        case TemplateUploaded():
            return _existing(state, event).model_copy(
                update={
                    "capture_key": event.key,
                    "capture_of": event.source_sandbox_id,
                    "capture_bytes": event.capture_bytes,
                    "image_bytes": event.image_bytes,
                }
            )
        case TemplateBuildPublished():
            return _published(state, event)
        case TemplateTagsAssigned():
            s = _existing(state, event)
            target = TaggedBuild(build_id=event.build_id, capture_id=event.capture_id, at=event.at)
            tags = {**s.effective_tags(), **dict.fromkeys(event.tags, target)}
            return _retagged(s, tags, event.released, event.at)
        case TemplateTagsRemoved():
            s = _existing(state, event)
            tags = {t: b for t, b in s.effective_tags().items() if t not in event.tags}
            return _retagged(s, tags, event.released, event.at)
        case TemplateCaptureDropped():
            s = _existing(state, event)
            released = {c: t for c, t in s.released.items() if c != event.capture_id}
            return s.model_copy(update={"released": released})
        case _:
            assert_never(event)


def _published(state: Template | None, event: TemplateBuildPublished) -> Template:
    fields = event.model_dump(
        include={"template_id", "alias", "envd_version", "cpu_count", "memory_mb", "disk_size_mb"}
    )
    target = TaggedBuild(build_id=event.build_id, capture_id=event.capture_id, at=event.at)
    if state is None or state.deleted:  # a new template (or a name used again): no tags yet
        base = Template(**fields, released=state.released if state is not None else {})
        before: dict[str, TaggedBuild] = {}
    else:
        base = state.model_copy(update=fields)
        before = base.effective_tags()
    return _retagged(
        base, {**before, **dict.fromkeys(event.tags, target)}, event.released, event.at
    )


def _retagged(
    state: Template, tags: dict[str, TaggedBuild], released: tuple[str, ...], at: datetime
) -> Template:
    """`state` with its new tags, and the captures they no longer name waiting to be
    dropped (since `at`). A capture a tag names is never waiting, whatever the log says."""
    waiting = {**state.released, **dict.fromkeys(released, at)}
    named = captures(tags)
    return state.model_copy(
        update={"tags": tags, "released": {c: t for c, t in waiting.items() if c not in named}}
    )


def _existing(state: Template | None, event: Event) -> Template:
    if state is None:
        raise CorruptHistory(f"{type(event).__name__} of a template never registered")
    return state


def fold_template(events: Iterable[Event], state: Template | None = None) -> Template | None:
    return reduce(evolve_template, events, state)
