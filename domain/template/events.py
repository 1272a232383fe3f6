"""The template aggregate's events: the closed set `evolve_template` folds."""

from __future__ import annotations

from domain.messages import Event

__all__ = [
    "TEMPLATE_EVENTS",
    "AnyTemplateEvent",
    "TemplateBuildPublished",
    "TemplateCaptureDropped",
    "TemplateDeleted",
    "TemplateImported",
    "TemplateRegistered",
    "TemplateTagsAssigned",
    "TemplateTagsRemoved",
    "TemplateUploaded",
]


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
    #: None: an imported image's capture (no sandbox's token in its guest)
    source_sandbox_id: str | None = None
    #: What a node without the template stores to create from it (placement by disk):
    #: its capture's bytes, and the image and runtime disks under it. None: an upload
    #: recorded before sizes were.
    capture_bytes: int | None = None
    image_bytes: int | None = None


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
