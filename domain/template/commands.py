"""The template aggregate's commands: what users, the builder and nodes ask of a template."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from domain.messages import Command
from domain.tags import DEFAULT_TAG

__all__ = [
    "AnyTemplateCommand",
    "AssignTemplateTags",
    "CompleteTemplateImport",
    "DeleteTemplate",
    "DropTemplateCapture",
    "ImportTemplateImage",
    "PublishTemplateBuild",
    "RecordTemplateUpload",
    "RegisterTemplate",
    "RemoveTemplateTags",
    "TemplateCommand",
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
    """Node: a template's capture is in the snapshot repository under `key`;
    `source_sandbox_id` is the sandbox it was taken of (its guest holds that sandbox's
    envd token, which a node restoring the capture elsewhere must present), None for an
    imported image's capture (its guest holds no sandbox's token)."""

    key: str = Field(min_length=1)
    source_sandbox_id: str | None = Field(default=None, min_length=1)
    #: allocated bytes of the capture, and of the image and runtime disks it stacks on
    #: (`TemplateUploaded`: what placement by disk counts)
    capture_bytes: int | None = Field(default=None, ge=0)
    image_bytes: int | None = Field(default=None, ge=0)


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
    #: free space (MiB) the template's root disk keeps beyond the image (a build's
    #: `minFreeDiskMb`); None: the node's default (`NodeSettings.image_free_bytes`)
    disk_free_mb: int | None = Field(default=None, ge=0, le=1 << 20)

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
