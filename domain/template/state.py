"""The template aggregate's state, and the templates nodes make themselves."""

from __future__ import annotations

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from domain.tags import DEFAULT_TAG, TaggedBuild

__all__ = ["BUILTIN_TEMPLATES", "Template"]

#: Templates a node makes itself (from images it builds), public to every team and never
#: rebuilt or deleted through the API: `base`, and E2B's `code-interpreter-v1` on nodes
#: that serve it (AENV_CODE_INTERPRETER).
BUILTIN_TEMPLATES = frozenset({"base", "code-interpreter-v1"})


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
    #: what a node without it stores to create from it: the durable capture's bytes, and
    #: the image and runtime disks under it (None: not uploaded, or before sizes were
    #: recorded — placement then counts nothing for them)
    capture_bytes: int | None = None
    image_bytes: int | None = None
    #: the node that imported the image (its capture is there until `capture_key`)
    imported_on: str | None = None
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
