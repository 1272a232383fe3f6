"""The template build aggregate's events (`domain.build` decides and folds them) and its
log's entries."""

from __future__ import annotations

from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict

from domain.buildspec import BuildSpec
from domain.messages import Event

__all__ = [
    "BUILD_EVENTS",
    "AnyBuildEvent",
    "BuildLogEntry",
    "TemplateBuildClaimed",
    "TemplateBuildDiscarded",
    "TemplateBuildFailed",
    "TemplateBuildJoined",
    "TemplateBuildLogged",
    "TemplateBuildRequested",
    "TemplateBuildStarted",
    "TemplateBuilt",
]


class BuildLogEntry(BaseModel):
    model_config = ConfigDict(frozen=True)

    at: AwareDatetime
    level: Literal["debug", "info", "warn", "error"] = "info"
    message: str
    step: str | None = None


class TemplateBuildRequested(Event):
    build_id: str
    template_id: str
    alias: str | None
    team_id: str | None
    cpu_count: int
    memory_mb: int
    disk_size_mb: int
    tags: tuple[str, ...] = ()  # absent from events written before tags


class TemplateBuildStarted(Event):
    build_id: str
    spec: BuildSpec
    node_id: str | None = None
    #: waiting for a builder to claim it; absent (False) from events written before the
    #: API recorded starts — then the builder recorded it when it began to run it
    queued: bool = False


class TemplateBuildClaimed(Event):
    build_id: str
    key_id: str | None = None  # absent from claims before builds were shared


class TemplateBuildJoined(Event):
    """The build shares the result of `leader_build_id` instead of running a sandbox."""

    build_id: str
    leader_build_id: str
    key_id: str


class TemplateBuildLogged(Event):
    build_id: str
    #: index of the first entry in the build's log (the status route's `logsOffset`)
    first_index: int
    entries: tuple[BuildLogEntry, ...]


class TemplateBuilt(Event):
    build_id: str
    sandbox_id: str | None = None
    envd_version: str | None = None


class TemplateBuildFailed(Event):
    build_id: str
    reason: str
    step: str | None = None


class TemplateBuildDiscarded(Event):
    build_id: str


#: The closed set of build events (`evolve_build` matches it exhaustively).
AnyBuildEvent = (
    TemplateBuildRequested
    | TemplateBuildStarted
    | TemplateBuildClaimed
    | TemplateBuildJoined
    | TemplateBuildLogged
    | TemplateBuilt
    | TemplateBuildFailed
    | TemplateBuildDiscarded
)
BUILD_EVENTS = (
    TemplateBuildRequested,
    TemplateBuildStarted,
    TemplateBuildClaimed,
    TemplateBuildJoined,
    TemplateBuildLogged,
    TemplateBuilt,
    TemplateBuildFailed,
    TemplateBuildDiscarded,
)
