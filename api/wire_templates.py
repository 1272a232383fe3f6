"""E2B's template-build REST types (`POST /v3/templates`, build start, build status, tags), in
the shapes of the SDK's generated models (`e2b/api/client/models/template_*.py`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

_REQ = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)


class NewTemplateBuild(BaseModel):
    """`POST /v3/templates` (TemplateBuildRequestV3): `name` is `name` or `name:tag`."""

    model_config = _REQ
    name: str | None = Field(None, max_length=200)
    alias: str | None = Field(None, max_length=200)  # deprecated spelling of `name`
    tags: list[str] = Field(default_factory=list)
    cpu_count: int | None = Field(None, alias="cpuCount", ge=1, le=16)
    memory_mb: int | None = Field(None, alias="memoryMB", ge=128, le=65536)
    min_free_disk_mb: int | None = Field(None, alias="minFreeDiskMb", ge=0)


class Step(BaseModel):
    model_config = _REQ
    type: str = Field(min_length=1, max_length=32)
    args: list[str] = Field(default_factory=list)
    files_hash: str | None = Field(None, alias="filesHash", max_length=128)
    force: bool | None = False


class BuildStart(BaseModel):
    """`POST /v2/templates/{id}/builds/{buildID}` (TemplateBuildStartV2)."""

    model_config = _REQ
    from_image: str | None = Field(None, alias="fromImage")
    from_template: str | None = Field(None, alias="fromTemplate")
    from_image_registry: dict[str, object] | None = Field(None, alias="fromImageRegistry")
    force: bool | None = False
    steps: list[Step] = Field(default_factory=list)
    start_cmd: str | None = Field(None, alias="startCmd")
    ready_cmd: str | None = Field(None, alias="readyCmd")


class AssignTags(BaseModel):
    """`POST /templates/tags` (AssignTemplateTagsRequest): `target` is `name` or
    `name:tag`, the build to tag from."""

    model_config = _REQ
    target: str = Field(min_length=1, max_length=300)
    tags: list[str] = Field(max_length=100)


class RemoveTags(BaseModel):
    """`DELETE /templates/tags` (DeleteTemplateTagsRequest): `name` carries no tag."""

    model_config = _REQ
    name: str = Field(min_length=1, max_length=200)
    tags: list[str] = Field(max_length=100)
