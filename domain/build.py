"""The template build aggregate: one build of a template, from request to ready or error.

A build is an aggregate of its own (subject `aenv.evt.build.<build_id>`), not a field of the
template: a template has many builds, a build a lifecycle of its own (waiting → building →
ready | error; E2B's `waiting` is "its files still uploading", then `building`, `queued`
until a builder claims it) and a log the builder appends to: log appends never contend
with template registration. The log lives in `TemplateBuildLogged` events, bounded (see the
`MAX_LOG_*`): the status route needs it long after the build sandbox is gone, and the event
log is the only state a rebuild of the read models may use.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime
from enum import StrEnum
from functools import reduce
from typing import ClassVar, Literal, assert_never

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from domain.errors import Conflict, CorruptHistory, Invalid, NotFound
from domain.messages import Command, CommandRejected, Event
from domain.tags import normalize_tags

__all__ = [
    "MAX_LOG_BATCH",
    "MAX_LOG_ENTRIES",
    "MAX_LOG_MESSAGE",
    "STEP_TYPES",
    "AnyBuildCommand",
    "AnyBuildEvent",
    "Build",
    "BuildLogEntry",
    "BuildSpec",
    "BuildStatus",
    "BuildStep",
    "ClaimTemplateBuild",
    "CompleteTemplateBuild",
    "DiscardTemplateBuild",
    "LogTemplateBuild",
    "RequestTemplateBuild",
    "StartTemplateBuild",
    "TemplateBuildClaimed",
    "TemplateBuildCommand",
    "TemplateBuildDiscarded",
    "TemplateBuildFailed",
    "TemplateBuildLogged",
    "TemplateBuildRequested",
    "TemplateBuildStarted",
    "TemplateBuilt",
    "decide_build",
    "evolve_build",
    "fold_build",
    "valid_template_name",
]

#: Instructions a build runs. Anything else is accepted into the spec (so the build, not the
#: request, fails with the step named), as E2B reports a bad step through the build status.
STEP_TYPES = frozenset({"RUN", "COPY", "ENV", "WORKDIR", "USER", "ARG"})
MAX_LOG_BATCH = 200
MAX_LOG_MESSAGE = 4096
MAX_LOG_ENTRIES = 5000
MAX_STEPS = 500

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")


def valid_template_name(name: str) -> bool:
    """Template names double as template ids and snapshot names (`Sandbox.create(name)`)."""
    return bool(_NAME.match(name))


class BuildStatus(StrEnum):
    WAITING = "waiting"  # requested, steps not sent yet (E2B: files are being uploaded)
    BUILDING = "building"  # steps sent: queued for a builder, or running
    READY = "ready"
    ERROR = "error"


class BuildStep(BaseModel):
    """One instruction, in E2B's wire shape (`type`, `args`, `filesHash` for COPY)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: str = Field(min_length=1, max_length=32)
    args: tuple[str, ...] = ()
    files_hash: str | None = None
    force: bool = False


class BuildSpec(BaseModel):
    """What to build: a base (an existing template, or an image the node can convert) and
    the steps on top; `start_cmd` runs in the background before the snapshot, `ready_cmd`
    must then succeed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    from_template: str | None = None
    from_image: str | None = None
    #: a private registry's username for `from_image`; its password is kept beside the log
    #: (the secrets bucket, under the build id) and never in it
    from_image_username: str | None = None
    steps: tuple[BuildStep, ...] = ()
    start_cmd: str | None = None
    ready_cmd: str | None = None
    #: E2B's `force` (`skip_cache`): nothing cached is reused, a FROM image is pulled again
    force: bool = False


class BuildLogEntry(BaseModel):
    model_config = ConfigDict(frozen=True)

    at: AwareDatetime
    level: Literal["debug", "info", "warn", "error"] = "info"
    message: str
    step: str | None = None


# ---- commands ---------------------------------------------------------------------------
class TemplateBuildCommand(Command):
    """A command addressed to one template build aggregate."""

    aggregate: ClassVar[str] = "build"
    aggregate_field: ClassVar[str] = "build_id"

    build_id: str = Field(min_length=1)


class RequestTemplateBuild(TemplateBuildCommand):
    """`POST /v3/templates`: a new build of template `template_id` (created if new)."""

    creates: ClassVar[bool] = True

    template_id: str = Field(min_length=1)
    alias: str | None = None
    team_id: str | None = None
    cpu_count: int = Field(default=2, ge=1, le=16)
    memory_mb: int = Field(default=512, ge=128, le=65536)
    disk_size_mb: int = Field(default=2048, ge=0)
    #: what the build is to be called besides `default` (`name:v1`, E2B's `tags`)
    tags: tuple[str, ...] = ()


class StartTemplateBuild(TemplateBuildCommand):
    """`POST /v2/templates/{id}/builds/{buildID}`: the steps. Recorded by the API before it
    answers (the build is `building` from then on, as E2B's), queued for a builder."""

    spec: BuildSpec
    #: where the base template's capture lives (None: any node, e.g. `base`)
    node_id: str | None = None


class ClaimTemplateBuild(TemplateBuildCommand):
    """Builder: it runs this started build now (so a redelivery of the start, once it has
    been claimed, means the builder that claimed it stopped)."""


class LogTemplateBuild(TemplateBuildCommand):
    entries: tuple[BuildLogEntry, ...]


class CompleteTemplateBuild(TemplateBuildCommand):
    """The builder's verdict: `error` None means the template is captured and registered."""

    error: str | None = None
    step: str | None = None
    sandbox_id: str | None = None
    envd_version: str | None = None


class DiscardTemplateBuild(TemplateBuildCommand):
    """`DELETE /templates/{id}` of a template no build published (its builds failed): the
    build leaves the listing; a running one cannot (409), a discarded one never starts."""


#: The closed set of build commands (`decide_build` matches it exhaustively).
AnyBuildCommand = (
    RequestTemplateBuild
    | StartTemplateBuild
    | ClaimTemplateBuild
    | LogTemplateBuild
    | CompleteTemplateBuild
    | DiscardTemplateBuild
)


# ---- events -----------------------------------------------------------------------------
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


# ---- state ------------------------------------------------------------------------------
class Build(BaseModel):
    model_config = ConfigDict(frozen=True)

    build_id: str
    template_id: str
    alias: str | None
    team_id: str | None
    cpu_count: int
    memory_mb: int
    disk_size_mb: int
    status: BuildStatus = BuildStatus.WAITING
    tags: tuple[str, ...] = ()
    #: started, not yet claimed by a builder (E2B shows it `building` all the same)
    queued: bool = False
    spec: BuildSpec | None = None
    node_id: str | None = None
    reason: str | None = None
    failed_step: str | None = None
    sandbox_id: str | None = None
    envd_version: str | None = None
    log_count: int = 0
    #: its template was deleted before any build of it was published
    discarded: bool = False
    requested_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def finished(self) -> bool:
        return self.status in (BuildStatus.READY, BuildStatus.ERROR)


def _clip(entry: BuildLogEntry) -> BuildLogEntry:
    if len(entry.message) <= MAX_LOG_MESSAGE:
        return entry
    return entry.model_copy(update={"message": entry.message[: MAX_LOG_MESSAGE - 1] + "…"})


def decide_build(state: Build | None, command: AnyBuildCommand) -> list[Event]:
    """Pure: the events a command causes on a build (domain errors for refusals).

    A build runs once: starting a started build is a conflict, finishing a finished one
    decides nothing (a redelivered verdict), and logs after the end are dropped.
    """
    match command:
        case RequestTemplateBuild():
            return _request(state, command)
        case StartTemplateBuild():
            state = _requested(state, command.build_id)
            if state.discarded:
                raise NotFound(f"build {command.build_id} was deleted with its template")
            if state.status is not BuildStatus.WAITING:
                if state.spec == command.spec:
                    return []  # a retried start
                raise Conflict(f"build {command.build_id} was already started ({state.status})")
            _check_spec(command.spec)
            return [
                TemplateBuildStarted(
                    build_id=command.build_id,
                    spec=command.spec,
                    node_id=command.node_id,
                    queued=True,
                    at=command.at,
                )
            ]
        case ClaimTemplateBuild():
            state = _requested(state, command.build_id)
            if state.status is BuildStatus.WAITING:
                raise Conflict(f"build {command.build_id} has not started")
            if state.finished or not state.queued:
                return []  # done, or another builder has it
            return [TemplateBuildClaimed(build_id=command.build_id, at=command.at)]
        case LogTemplateBuild():
            state = _requested(state, command.build_id)
            room = MAX_LOG_ENTRIES - state.log_count
            entries = tuple(_clip(e) for e in command.entries[: min(room, MAX_LOG_BATCH)])
            if state.finished or not entries:
                return []
            return [
                TemplateBuildLogged(
                    build_id=command.build_id,
                    first_index=state.log_count,
                    entries=entries,
                    at=command.at,
                )
            ]
        case CompleteTemplateBuild():
            return _complete(_requested(state, command.build_id), command)
        case DiscardTemplateBuild():
            state = _requested(state, command.build_id)
            if state.status is BuildStatus.BUILDING:
                raise Conflict(f"build {command.build_id} of {state.template_id} is running")
            done = state.discarded
            return [] if done else [TemplateBuildDiscarded(build_id=state.build_id, at=command.at)]
        case _:
            assert_never(command)


def _request(state: Build | None, c: RequestTemplateBuild) -> list[Event]:
    if state is not None:
        if state.template_id != c.template_id:
            raise Conflict(f"build {c.build_id} belongs to {state.template_id}")
        return []  # a retried request
    if not valid_template_name(c.template_id):
        raise Invalid(f"invalid template name {c.template_id!r}")
    fields = c.model_dump(exclude={"command_id", "at", "tags"})
    return [TemplateBuildRequested(**fields, tags=normalize_tags(c.tags), at=c.at)]


def _complete(s: Build, c: CompleteTemplateBuild) -> list[Event]:
    if s.finished:
        return []
    if s.status is not BuildStatus.BUILDING:
        raise Conflict(f"build {c.build_id} has not started")
    if c.error is not None:
        return [TemplateBuildFailed(build_id=c.build_id, reason=c.error, step=c.step, at=c.at)]
    built = TemplateBuilt(
        build_id=c.build_id, sandbox_id=c.sandbox_id, envd_version=c.envd_version, at=c.at
    )
    return [built]


def _requested(state: Build | None, build_id: str) -> Build:
    if state is None:
        raise NotFound(f"build {build_id} not found")
    return state


def _check_spec(spec: BuildSpec) -> None:
    """Request-level checks (400); step-level problems fail the build at that step."""
    if (spec.from_template is None) == (spec.from_image is None):
        raise Invalid("a build needs exactly one of fromTemplate or fromImage")
    if len(spec.steps) > MAX_STEPS:
        raise Invalid(f"at most {MAX_STEPS} steps per build")


#: The closed set of build events (`evolve_build` matches it exhaustively).
AnyBuildEvent = (
    TemplateBuildRequested
    | TemplateBuildStarted
    | TemplateBuildClaimed
    | TemplateBuildLogged
    | TemplateBuilt
    | TemplateBuildFailed
    | TemplateBuildDiscarded
)
BUILD_EVENTS = (
    TemplateBuildRequested,
    TemplateBuildStarted,
    TemplateBuildClaimed,
    TemplateBuildLogged,
    TemplateBuilt,
    TemplateBuildFailed,
    TemplateBuildDiscarded,
)


def evolve_build(state: Build | None, event: Event) -> Build | None:
    if isinstance(event, CommandRejected):
        return state
    if not isinstance(event, BUILD_EVENTS):
        raise CorruptHistory(f"not a build event: {type(event).__name__}")
    return _evolve_build(state, event)


def _evolve_build(state: Build | None, event: AnyBuildEvent) -> Build | None:
    if isinstance(event, TemplateBuildRequested):
        return Build(**event.model_dump(exclude={"at"}), requested_at=event.at)
    if state is None:
        raise CorruptHistory(f"{type(event).__name__} before TemplateBuildRequested")
    match event:
        case TemplateBuildStarted():
            return state.model_copy(
                update={
                    "status": BuildStatus.BUILDING,
                    "queued": event.queued,
                    "spec": event.spec,
                    "node_id": event.node_id,
                    "started_at": event.at,
                }
            )
        case TemplateBuildClaimed():
            return state.model_copy(update={"queued": False})
        case TemplateBuildLogged():
            return state.model_copy(update={"log_count": event.first_index + len(event.entries)})
        case TemplateBuilt():
            return state.model_copy(
                update={
                    "status": BuildStatus.READY,
                    "queued": False,
                    "finished_at": event.at,
                    "sandbox_id": event.sandbox_id,
                    "envd_version": event.envd_version,
                }
            )
        case TemplateBuildFailed():
            return state.model_copy(
                update={
                    "status": BuildStatus.ERROR,
                    "queued": False,
                    "finished_at": event.at,
                    "reason": event.reason,
                    "failed_step": event.step,
                }
            )
        case TemplateBuildDiscarded():
            return state.model_copy(update={"discarded": True})
        case _:
            assert_never(event)


def fold_build(events: Iterable[Event], state: Build | None = None) -> Build | None:
    return reduce(evolve_build, events, state)
