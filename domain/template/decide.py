"""`decide_template`: a template command against the template's state, as events."""

from __future__ import annotations

from typing import assert_never

from domain.errors import Conflict, Invalid, NotFound
from domain.messages import Event
from domain.tags import DEFAULT_TAG, TaggedBuild, captures, normalize_tags, released_by
from domain.template.commands import (
    AnyTemplateCommand,
    AssignTemplateTags,
    CompleteTemplateImport,
    DeleteTemplate,
    DropTemplateCapture,
    PublishTemplateBuild,
    RecordTemplateUpload,
    RegisterTemplate,
    RemoveTemplateTags,
)
from domain.template.events import (
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

__all__ = ["decide_template"]


def decide_template(state: Template | None, command: AnyTemplateCommand) -> list[Event]:
    """Register is an upsert (no event if nothing changes); delete of a missing one is 404;
    an upload is recorded once per capture, and is moot for a template that is gone or
    whose capture has been replaced since (a late upload must not make the old state the
    one another node would start the name from); an import is reported once registered.
    Tag changes: `_decide_tags`."""
    match command:
        case DeleteTemplate():
            if state is None or state.deleted:
                raise NotFound(f"template {command.template_id} not found")
            # its own capture is dropped by the delete itself (every node hears it)
            released = tuple(sorted(captures(state.tags) - {state.template_id}))
            return [
                TemplateDeleted(template_id=command.template_id, released=released, at=command.at)
            ]
        case RecordTemplateUpload():
            if state is None or state.deleted or state.capture_key == command.key:
                return []
            if state.capture_id is not None and state.capture_id != command.key:
                return []
            return [
                TemplateUploaded(
                    template_id=command.template_id,
                    key=command.key,
                    source_sandbox_id=command.source_sandbox_id,
                    capture_bytes=command.capture_bytes,
                    image_bytes=command.image_bytes,
                    at=command.at,
                )
            ]
        case CompleteTemplateImport():
            if state is None or state.deleted:
                raise NotFound(f"template {command.template_id} was not registered")
            return [
                TemplateImported(
                    template_id=command.template_id,
                    node_id=command.node_id,
                    image_digest=command.image_digest,
                    at=command.at,
                )
            ]
        case RegisterTemplate():
            fields = command.model_dump(exclude={"command_id", "at"})
            if state is not None and not state.deleted:
                if state.model_dump(include=set(fields)) == fields:
                    return []
                _check_alias(state, command.alias)
            return [TemplateRegistered(**fields, at=command.at)]
        case (
            PublishTemplateBuild()
            | AssignTemplateTags()
            | RemoveTemplateTags()
            | DropTemplateCapture()
        ):
            return _decide_tags(state, command)
        case _:
            assert_never(command)


TagCommand = PublishTemplateBuild | AssignTemplateTags | RemoveTemplateTags | DropTemplateCapture


def _decide_tags(state: Template | None, command: TagCommand) -> list[Event]:
    """A published build takes `default` and its tags (a redelivered publish decides
    nothing); assigning needs a target tag that exists and at least one tag; removing
    cannot take `default`, and ignores tags the template does not have (as E2B's). Every
    change names the captures it leaves untagged (`released`)."""
    tid = command.template_id
    match command:
        case PublishTemplateBuild():
            wanted = (*normalize_tags(command.tags), DEFAULT_TAG)
            wanted = tuple(dict.fromkeys(wanted))
            live = state if state is not None and not state.deleted else None
            before = live.effective_tags() if live is not None else {}
            if live is not None:
                _check_alias(live, command.alias)
            target = TaggedBuild(build_id=command.build_id, capture_id=command.capture_id)
            if live is not None and all(target.same_build(before.get(t)) for t in wanted):
                return []
            after = {**before, **dict.fromkeys(wanted, target)}
            fields = command.model_dump(exclude={"command_id", "at", "tags"})
            return [
                TemplateBuildPublished(
                    **fields, tags=wanted, released=released_by(before, after), at=command.at
                )
            ]
        case AssignTemplateTags():
            wanted = normalize_tags(command.tags)
            if not wanted:
                raise Invalid("at least one tag is required")
            live = _live(state, tid)
            source = live.tagged(command.target_tag.strip().lower())
            if source is None:
                raise NotFound(f"template '{tid}' with tag '{command.target_tag}' not found")
            before = live.effective_tags()
            if all(source.same_build(before.get(t)) for t in wanted):
                return []
            after = {**before, **dict.fromkeys(wanted, source)}
            return [
                TemplateTagsAssigned(
                    template_id=tid,
                    build_id=source.build_id,
                    capture_id=source.capture_id,
                    tags=wanted,
                    released=released_by(before, after),
                    at=command.at,
                )
            ]
        case RemoveTemplateTags():
            wanted = normalize_tags(command.tags)
            if not wanted:
                raise Invalid("at least one tag is required")
            if DEFAULT_TAG in wanted:
                raise Invalid(f"cannot delete the '{DEFAULT_TAG}' tag")
            live = _live(state, tid)
            before = live.effective_tags()
            present = tuple(t for t in wanted if t in before)
            if not present:
                return []
            after = {t: b for t, b in before.items() if t not in present}
            return [
                TemplateTagsRemoved(
                    template_id=tid,
                    tags=present,
                    released=released_by(before, after),
                    at=command.at,
                )
            ]
        case DropTemplateCapture():
            if state is None or command.capture_id not in state.released:
                return []
            return [
                TemplateCaptureDropped(
                    template_id=tid, capture_id=command.capture_id, at=command.at
                )
            ]
        case _:
            assert_never(command)


def _live(state: Template | None, template_id: str) -> Template:
    if state is None or state.deleted:
        raise NotFound(f"template '{template_id}' not found")
    return state


def _check_alias(state: Template, alias: str | None) -> None:
    if state.alias is not None and alias is not None and state.alias != alias:
        raise Conflict(f"template {state.template_id} already has alias {state.alias}")
