"""The template aggregate: a named, bootable image sandboxes are created from.

Kept minimal here (register, delete); builds belong to the node worker's issue. The read
model's `templates` table and the API's template lookup need only this much — plus, for a
persistent snapshot, where its capture is durable (`TemplateUploaded`): creates from it may
then go to any node when the one that took it is gone.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import reduce
from typing import ClassVar, assert_never

from pydantic import BaseModel, ConfigDict, Field, model_validator

from domain.errors import Conflict, CorruptHistory, NotFound
from domain.messages import Command, CommandRejected, Event

__all__ = [
    "AnyTemplateCommand",
    "AnyTemplateEvent",
    "CompleteTemplateImport",
    "DeleteTemplate",
    "ImportTemplateImage",
    "RecordTemplateUpload",
    "RegisterTemplate",
    "Template",
    "TemplateCommand",
    "TemplateDeleted",
    "TemplateImported",
    "TemplateRegistered",
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


#: The template commands `decide_template` decides (closed; matched exhaustively). An
#: `ImportTemplateImage` is work for a node, answered by its `CompleteTemplateImport`.
AnyTemplateCommand = (
    RegisterTemplate | DeleteTemplate | RecordTemplateUpload | CompleteTemplateImport
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


class TemplateUploaded(Event):
    template_id: str
    key: str
    source_sandbox_id: str


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


def decide_template(state: Template | None, command: AnyTemplateCommand) -> list[Event]:
    """Register is an upsert (no event if nothing changes); delete of a missing one is 404;
    an upload is recorded once per capture, and is moot for a template that is gone or
    whose capture has been replaced since (a late upload must not make the old state the
    one another node would start the name from); an import is reported once registered."""
    match command:
        case DeleteTemplate():
            if state is None or state.deleted:
                raise NotFound(f"template {command.template_id} not found")
            return [TemplateDeleted(template_id=command.template_id, at=command.at)]
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
            return [TemplateImported(template_id=command.template_id, node_id=command.node_id,
                                     image_digest=command.image_digest, at=command.at)]  # fmt: skip
        case RegisterTemplate():
            fields = command.model_dump(exclude={"command_id", "at"})
            if state is not None and not state.deleted:
                if state.model_dump(exclude={"deleted", "capture_key", "capture_of"}) == fields:
                    return []
                if state.alias is not None and command.alias is not None and (
                    state.alias != command.alias
                ):
                    raise Conflict(
                        f"template {command.template_id} already has alias {state.alias}"
                    )
            return [TemplateRegistered(**fields, at=command.at)]
        case _:
            assert_never(command)


#: The closed set of template events (`evolve_template` matches it exhaustively).
AnyTemplateEvent = TemplateRegistered | TemplateDeleted | TemplateUploaded | TemplateImported
TEMPLATE_EVENTS = (TemplateRegistered, TemplateDeleted, TemplateUploaded, TemplateImported)


def evolve_template(state: Template | None, event: Event) -> Template | None:
    if isinstance(event, CommandRejected):
        return state
    if not isinstance(event, TEMPLATE_EVENTS):
        raise CorruptHistory(f"not a template event: {type(event).__name__}")
    return _evolve_template(state, event)


def _evolve_template(state: Template | None, event: AnyTemplateEvent) -> Template | None:
    match event:
        case TemplateRegistered():
            return Template(**event.model_dump(exclude={"at"}))
        case TemplateImported():
            return state  # an import is registered by the TemplateRegistered before it
        case TemplateDeleted():
            return _existing(state, event).model_copy(update={"deleted": True})
        case TemplateUploaded():
            return _existing(state, event).model_copy(
                update={"capture_key": event.key, "capture_of": event.source_sandbox_id}
            )
        case _:
            assert_never(event)


def _existing(state: Template | None, event: Event) -> Template:
    if state is None:
        raise CorruptHistory(f"{type(event).__name__} of a template never registered")
    return state


def fold_template(events: Iterable[Event], state: Template | None = None) -> Template | None:
    return reduce(evolve_template, events, state)
