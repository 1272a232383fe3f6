"""The template aggregate: a named, bootable image sandboxes are created from.

Registered by whoever captured it (a node's snapshot or image import), deleted by a user;
for a persistent snapshot, where its capture is durable (`TemplateUploaded`): creates from
it may then go to any node when the one that took it is gone.

A built template is a table of tags (`domain/tags.py`): each successful build is captured
as a template of its own and published here (`PublishTemplateBuild`: it becomes `default`
and takes the tags it was built with); users move and remove tags; a capture no tag names
any more is *released* — kept in `released` until the API has dropped it from the nodes
(`DropTemplateCapture`), so a crash between the two leaves a record, not a leak.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from functools import reduce
from typing import ClassVar, assert_never

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from domain.errors import Conflict, CorruptHistory, Invalid, NotFound
from domain.messages import Command, CommandRejected, Event
from domain.tags import DEFAULT_TAG, TaggedBuild, captures, normalize_tags, released_by

#: Templates a node makes itself (from images it builds), public to every team and never
#: rebuilt or deleted through the API: `base`, and E2B's `code-interpreter-v1` on nodes
#: that serve it (AENV_CODE_INTERPRETER).
BUILTIN_TEMPLATES = frozenset({"base", "code-interpreter-v1"})

__all__ = [
    "AnyTemplateCommand",
    "AnyTemplateEvent",
    "AssignTemplateTags",
    "CompleteTemplateImport",
    "DeleteTemplate",
    "DropTemplateCapture",
    "ImportTemplateImage",
    "PublishTemplateBuild",
    "RecordTemplateUpload",
    "RegisterTemplate",
    "RemoveTemplateTags",
    "Template",
    "TemplateBuildPublished",
    "TemplateCaptureDropped",
    "TemplateCommand",
    "TemplateDeleted",
    "TemplateImported",
    "TemplateRegistered",
    "TemplateTagsAssigned",
    "TemplateTagsRemoved",
    "TemplateUploaded",
    "decide_template",
    "evolve_template",
    "fold_template",
]


class TemplateCommand(Command):
    """A command addressed to one template aggregate."""

    aggregate: ClassVar[str] = "template"
    aggregate_field: ClassVar[str] = "template_id"

    template_id: str = Field(min_length=1)


class RegisterTemplate(TemplateCommand):
    """Make a template available (or update its defaults). `capture_id`: a snapshot
    template's capture on its node — a new capture under the same name is a new template
    as far as durability goes (the repository holds the old one until its upload)."""

    alias: str | None = None
    envd_version: str = "0.6.13"
    cpu_count: int = 2
    memory_mb: int = 512
    disk_size_mb: int = 2048
    capture_id: str | None = None


class DeleteTemplate(TemplateCommand):
    """Drop a template (a snapshot's, or one imported from an image): 404 when there is none."""


class RecordTemplateUpload(TemplateCommand):
    """Node: a snapshot template's capture is in the snapshot repository under `key`;
    `source_sandbox_id` is the sandbox it was taken of (its guest holds that sandbox's
    envd token, which a node restoring the capture elsewhere must present)."""

    key: str = Field(min_length=1)
    source_sandbox_id: str = Field(min_length=1)


class ImportTemplateImage(TemplateCommand):
    """Make template `template_id` from an image: a local OCI image layout or archive
    (`image_path`), or a registry reference (`image_ref`, pulled by the node; `credentials`
    names the secret holding its login — never the password itself, which stays out of the
    log). The node converts it to a guest image, boots it once and captures it (a template
    build FROM an image, or `aenv pull`). Answered by `TemplateImported` or a
    `CommandRejected` on the template's subject (registered before it is answered)."""

    alias: str | None = None
    image_path: str | None = Field(default=None, min_length=1)
    image_ref: str | None = Field(default=None, min_length=1)
    credentials: str | None = None
    #: the template build this import is part of: the node writes its progress (pull,
    #: conversion, first boot) into that build's log
    build_id: str | None = None
    cpu_count: int = Field(default=1, ge=1, le=16)
    memory_mb: int = Field(default=512, ge=128, le=65536)

    @model_validator(mode="after")
    def _one_source(self) -> ImportTemplateImage:
        if (self.image_path is None) == (self.image_ref is None):
            raise ValueError("exactly one of image_path or image_ref")
        return self

    @property
    def image(self) -> str:
        """The image as a user named it."""
        return self.image_ref or self.image_path or ""


class CompleteTemplateImport(TemplateCommand):
    """Node: the image of an `ImportTemplateImage` is a template on this node now (after its
    `RegisterTemplate`): the answer the requester waits for."""

    image_digest: str = Field(min_length=1)
    node_id: str = Field(min_length=1)


class PublishTemplateBuild(TemplateCommand):
    """Builder: build `build_id` of the template succeeded and is captured as template
    `capture_id`. It becomes the template's `default` and takes `tags` (the template is
    registered with these defaults if it is new)."""

    alias: str | None = None
    envd_version: str
    cpu_count: int
    memory_mb: int
    disk_size_mb: int
    build_id: str = Field(min_length=1)
    capture_id: str = Field(min_length=1)
    tags: tuple[str, ...] = ()


class AssignTemplateTags(TemplateCommand):
    """`POST /templates/tags`: point `tags` at the build `target_tag` names now."""

    target_tag: str = DEFAULT_TAG
    tags: tuple[str, ...]


class RemoveTemplateTags(TemplateCommand):
    """`DELETE /templates/tags`: the template's `default` cannot be removed."""

    tags: tuple[str, ...]


class DropTemplateCapture(TemplateCommand):
    """API: a released capture is gone from the nodes (and its template from the log)."""

    capture_id: str = Field(min_length=1)


#: The template commands `decide_template` decides (closed; matched exhaustively). An
#: `ImportTemplateImage` is work for a node, answered by its `CompleteTemplateImport`.
AnyTemplateCommand = (
    RegisterTemplate
    | DeleteTemplate
    | RecordTemplateUpload
    | CompleteTemplateImport
    | PublishTemplateBuild
    | AssignTemplateTags
    | RemoveTemplateTags
    | DropTemplateCapture
)


class TemplateImported(Event):
    """A node holds a capture of the image; which image (its digest) is recorded."""

    template_id: str
    image_digest: str
    node_id: str


class TemplateRegistered(Event):
    template_id: str
    alias: str | None
    envd_version: str
    cpu_count: int
    memory_mb: int
    disk_size_mb: int
    capture_id: str | None = None  # absent from events written before it existed


class TemplateDeleted(Event):
    template_id: str
    #: the captures its tags named, released with it (none before tags existed)
    released: tuple[str, ...] = ()


class TemplateUploaded(Event):
    template_id: str
    key: str
    source_sandbox_id: str


class TemplateBuildPublished(Event):
    """A build became the template's `default` and took `tags` (`default` among them)."""

    template_id: str
    alias: str | None
    envd_version: str
    cpu_count: int
    memory_mb: int
    disk_size_mb: int
    build_id: str
    capture_id: str
    tags: tuple[str, ...]
    #: captures no tag names any more since this
    released: tuple[str, ...] = ()


class TemplateTagsAssigned(Event):
    template_id: str
    build_id: str | None
    capture_id: str
    tags: tuple[str, ...]
    released: tuple[str, ...] = ()


class TemplateTagsRemoved(Event):
    template_id: str
    tags: tuple[str, ...]
    released: tuple[str, ...] = ()


class TemplateCaptureDropped(Event):
    template_id: str
    capture_id: str


class Template(BaseModel):
    model_config = ConfigDict(frozen=True)

    template_id: str
    alias: str | None
    envd_version: str
    cpu_count: int
    memory_mb: int
    disk_size_mb: int
    deleted: bool = False
    #: a snapshot template's current capture (on the node that took it)
    capture_id: str | None = None
    #: that capture in the snapshot repository (None: only on its node so far)
    capture_key: str | None = None
    capture_of: str | None = None
    #: a built template's tags (empty: a template from before tags, or not built — its
    #: `default` is its own capture)
    tags: dict[str, TaggedBuild] = Field(default_factory=dict)
    #: captures no tag names any more, since when: the API drops them from the nodes once
    #: their grace period is over (kept across a delete: they must still be dropped)
    released: dict[str, AwareDatetime] = Field(default_factory=dict)

    def effective_tags(self) -> dict[str, TaggedBuild]:
        """The tags as creates see them: an untagged template's `default` is itself."""
        if self.tags or self.deleted:
            return dict(self.tags)
        return {DEFAULT_TAG: TaggedBuild(build_id=None, capture_id=self.template_id)}

    def tagged(self, tag: str) -> TaggedBuild | None:
        return self.effective_tags().get(tag)

    def capture_for(self, tag: str) -> str | None:
        """The template whose capture a create of `<id>:<tag>` restores, or None."""
        found = self.tagged(tag)
        return found.capture_id if found is not None else None


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


#: The closed set of template events (`evolve_template` matches it exhaustively).
AnyTemplateEvent = (
    TemplateRegistered
    | TemplateDeleted
    | TemplateUploaded
    | TemplateImported
    | TemplateBuildPublished
    | TemplateTagsAssigned
    | TemplateTagsRemoved
    | TemplateCaptureDropped
)
TEMPLATE_EVENTS = (
    TemplateRegistered,
    TemplateDeleted,
    TemplateUploaded,
    TemplateImported,
    TemplateBuildPublished,
    TemplateTagsAssigned,
    TemplateTagsRemoved,
    TemplateCaptureDropped,
)


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
            return state  # an import is registered by the TemplateRegistered before it
        case TemplateDeleted():
            s = _retagged(_existing(state, event), {}, event.released, event.at)
            return s.model_copy(update={"deleted": True})
        case TemplateUploaded():
            return _existing(state, event).model_copy(
                update={"capture_key": event.key, "capture_of": event.source_sandbox_id}
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
