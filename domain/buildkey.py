"""The build key aggregate: identical builds of one template share one build.

Its id is derived from a build's fingerprint (`domain.buildspec.spec_fingerprint`), its
subject `aenv.evt.buildkey.<id>`. The first builder to enter a key with its build leads it
(`BuildKeyLed`: that build runs the one build sandbox); a builder entering it with another
build while the leader runs — or while the leader's result is still the template's
`default` and the build was started before that verdict, i.e. it raced the leader — joins
it (`BuildKeyJoined`) and runs nothing. The leader's verdict settles the
key (`BuildKeySettled`) and is the verdict of every build that joined it. Builders on
several nodes deciding at once are ordered by the append's expected sequence, so exactly
one leads; a key settled with an error, or whose result is no longer `default`, is led
afresh by the next build (a new generation), and so is a build started after the verdict: a
build asked for once the last one was done is a build of its own (a capture of its own, as
E2B's), not the one before under another id.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from functools import reduce
from typing import ClassVar, assert_never

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from domain.errors import Conflict, CorruptHistory, NotFound
from domain.messages import Command, CommandRejected, Event

__all__ = [
    "BUILD_KEY_EVENTS",
    "AnyBuildKeyCommand",
    "AnyBuildKeyEvent",
    "BuildKey",
    "BuildKeyCommand",
    "BuildKeyJoined",
    "BuildKeyLed",
    "BuildKeySettled",
    "EnterBuildKey",
    "SettleBuildKey",
    "build_key_id",
    "decide_build_key",
    "evolve_build_key",
    "fold_build_key",
]


def build_key_id(fingerprint: str) -> str:
    """The key of builds with this fingerprint (a subject token: hex only)."""
    return f"bk-{fingerprint}"


# ---- commands ---------------------------------------------------------------------------
class BuildKeyCommand(Command):
    aggregate: ClassVar[str] = "buildkey"
    aggregate_field: ClassVar[str] = "key_id"

    key_id: str = Field(min_length=1)


class EnterBuildKey(BuildKeyCommand):
    """A builder took the start of `build_id`: it leads the key or joins its leader.

    `current_capture` is what the template's `default` names now (read by the builder), and
    `started_at` when the entering build was started: a settled leader's result is shared
    only while it is still that, with builds started before it was settled."""

    build_id: str = Field(min_length=1)
    template_id: str = Field(min_length=1)
    current_capture: str | None = None
    started_at: AwareDatetime | None = None


class SettleBuildKey(BuildKeyCommand):
    """The leader's verdict: `error` None means `capture_id` is published as the template."""

    build_id: str = Field(min_length=1)
    error: str | None = None
    step: str | None = None
    capture_id: str | None = None


AnyBuildKeyCommand = EnterBuildKey | SettleBuildKey


# ---- events -----------------------------------------------------------------------------
class BuildKeyLed(Event):
    key_id: str
    template_id: str
    build_id: str
    generation: int


class BuildKeyJoined(Event):
    key_id: str
    build_id: str
    leader_build_id: str


class BuildKeySettled(Event):
    key_id: str
    build_id: str
    error: str | None = None
    step: str | None = None
    capture_id: str | None = None


AnyBuildKeyEvent = BuildKeyLed | BuildKeyJoined | BuildKeySettled
BUILD_KEY_EVENTS = (BuildKeyLed, BuildKeyJoined, BuildKeySettled)


# ---- state ------------------------------------------------------------------------------
class BuildKey(BaseModel):
    """The current generation of a key: its leader, the builds that joined it, its end."""

    model_config = ConfigDict(frozen=True)

    key_id: str
    template_id: str
    generation: int
    leader: str
    followers: tuple[str, ...] = ()
    settled: bool = False
    error: str | None = None
    step: str | None = None
    capture_id: str | None = None
    settled_at: AwareDatetime | None = None

    @property
    def ready(self) -> bool:
        return self.settled and self.error is None

    def shares(self, current_capture: str | None, started_at: datetime | None) -> bool:
        """Whether a build entering now shares this generation: while it runs, or — if it
        was started before the verdict (it raced the leader; the API's and the builder's
        clocks, a skew of milliseconds at worst) — while the result is still what the
        template's `default` names. A failed generation never: the next build tries again."""
        if not self.settled:
            return True
        if not self.ready or self.capture_id is None or self.capture_id != current_capture:
            return False
        return (
            started_at is not None
            and self.settled_at is not None
            and (started_at <= self.settled_at)
        )

    def has(self, build_id: str) -> bool:
        return build_id == self.leader or build_id in self.followers


def decide_build_key(state: BuildKey | None, command: AnyBuildKeyCommand) -> list[Event]:
    """Pure: who leads, who joins; only the current leader settles, once."""
    match command:
        case EnterBuildKey():
            if state is not None and state.template_id != command.template_id:
                raise Conflict(f"key {command.key_id} is of template {state.template_id}")
            if state is not None and state.has(command.build_id):
                return []  # a redelivered start: its role stands
            if state is None or not state.shares(command.current_capture, command.started_at):
                led = BuildKeyLed(
                    key_id=command.key_id,
                    template_id=command.template_id,
                    build_id=command.build_id,
                    generation=1 if state is None else state.generation + 1,
                    at=command.at,
                )
                return [led]
            joined = BuildKeyJoined(
                key_id=command.key_id,
                build_id=command.build_id,
                leader_build_id=state.leader,
                at=command.at,
            )
            return [joined]
        case SettleBuildKey():
            if state is None:
                raise NotFound(f"build key {command.key_id} not found")
            if state.settled or state.leader != command.build_id:
                return []  # settled already, or a leader of an older generation
            fields = command.model_dump(exclude={"command_id", "at"})
            return [BuildKeySettled(**fields, at=command.at)]
        case _:
            assert_never(command)


def evolve_build_key(state: BuildKey | None, event: Event) -> BuildKey | None:
    if isinstance(event, CommandRejected):
        return state
    if not isinstance(event, BUILD_KEY_EVENTS):
        raise CorruptHistory(f"not a build key event: {type(event).__name__}")
    return _evolve(state, event)


def _evolve(state: BuildKey | None, event: AnyBuildKeyEvent) -> BuildKey:
    match event:
        case BuildKeyLed():
            return BuildKey(
                key_id=event.key_id,
                template_id=event.template_id,
                generation=event.generation,
                leader=event.build_id,
            )
        case BuildKeyJoined():
            s = _existing(state, event)
            return s.model_copy(update={"followers": (*s.followers, event.build_id)})
        case BuildKeySettled():
            s = _existing(state, event)
            update = {"error": event.error, "step": event.step, "capture_id": event.capture_id}
            return s.model_copy(update={**update, "settled": True, "settled_at": event.at})
        case _:
            assert_never(event)


def _existing(state: BuildKey | None, event: Event) -> BuildKey:
    if state is None:
        raise CorruptHistory(f"{type(event).__name__} before BuildKeyLed")
    return state


def fold_build_key(events: Iterable[Event], state: BuildKey | None = None) -> BuildKey | None:
    return reduce(evolve_build_key, events, state)
