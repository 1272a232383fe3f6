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
from typing import ClassVar, assert_never

from pydantic import BaseModel, ConfigDict, Field

from domain.buildevents import (
    BUILD_EVENTS,
    AnyBuildEvent,
    BuildLogEntry,
    TemplateBuildClaimed,
    TemplateBuildDiscarded,
    TemplateBuildFailed,
    TemplateBuildJoined,
    TemplateBuildLogged,
    TemplateBuildRequested,
    TemplateBuildStarted,
    TemplateBuilt,
)
from domain.buildspec import STEP_TYPES, BuildSpec, BuildStep, forced, spec_fingerprint
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
    "JoinTemplateBuild",
    "LogTemplateBuild",
    "RequestTemplateBuild",
    "StartTemplateBuild",
    "TemplateBuildClaimed",
    "TemplateBuildCommand",
    "TemplateBuildDiscarded",
    "TemplateBuildFailed",
    "TemplateBuildJoined",
    "TemplateBuildLogged",
    "TemplateBuildRequested",
    "TemplateBuildStarted",
    "TemplateBuilt",
    "decide_build",
    "evolve_build",
    "fold_build",
    "forced",
    "spec_fingerprint",
    "valid_template_name",
]

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

    #: the build key it leads (`domain.buildkey`): identical builds join it meanwhile
    key_id: str | None = None


class JoinTemplateBuild(TemplateBuildCommand):
    """Builder: this started build is identical to `leader_build_id`, which runs (or just
    ran) under the build key `key_id`: it runs no sandbox of its own and ends as the
    leader ends (its verdict is given by whoever sees the leader's first)."""

    leader_build_id: str = Field(min_length=1)
    key_id: str = Field(min_length=1)


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
    | JoinTemplateBuild
    | LogTemplateBuild
    | CompleteTemplateBuild
    | DiscardTemplateBuild
)


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
    #: the build key it leads or joined (None: a forced build, or one from before keys)
    key_id: str | None = None
    #: the build whose result it shares (it joined it), None when it ran itself
    leader_build_id: str | None = None
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
            claimed = TemplateBuildClaimed(
                build_id=command.build_id, key_id=command.key_id, at=command.at
            )
            return [claimed]
        case JoinTemplateBuild():
            return _join(_requested(state, command.build_id), command)
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


def _join(s: Build, c: JoinTemplateBuild) -> list[Event]:
    if s.status is BuildStatus.WAITING:
        raise Conflict(f"build {c.build_id} has not started")
    if c.leader_build_id == c.build_id:
        raise Invalid(f"build {c.build_id} cannot join itself")
    if s.finished or not s.queued:
        return []  # done (its leader's verdict came first), or claimed/joined already
    joined = TemplateBuildJoined(
        build_id=c.build_id, leader_build_id=c.leader_build_id, key_id=c.key_id, at=c.at
    )
    return [joined]


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
            return state.model_copy(update={"queued": False, "key_id": event.key_id})
        case TemplateBuildJoined():
            update = {"queued": False, "key_id": event.key_id}
            return state.model_copy(update={**update, "leader_build_id": event.leader_build_id})
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
