"""The volume aggregate: E2B's persistent volumes, as aenv keeps them — a block device.

A volume is an ext4 file system in a sparse image file of one fixed size, attached to at
most ONE holder at a time, like an EBS volume: a sandbox that mounts it (running or paused:
a paused guest's page cache still holds the file system), or a write through the volume's
own content API. Two holders would mean two kernels (or a kernel and a host tool) writing
one ext4 at once, which corrupts it; so exclusivity is the aggregate's one hard rule, and
its optimistic concurrency (one version per volume) is what makes an attach race safe.

Its content is durable as *versions*: each release records the key under which the
snapshot repository holds the image the holder left behind (content-addressed chunks), and
the node that keeps a local copy of it. A release names its holder and that holder's node,
so a stale one (a node that comes back after its sandbox moved, or was forcibly released)
decides nothing.

The id is derived from the team and the name (`volume_id_of`): the name is unique per team
by construction, and a create that mounts a volume by name (E2B's `volumeMounts`) needs no
lookup. A name destroyed can be created again: a new incarnation (a new token, no content).
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterable
from datetime import datetime
from functools import reduce
from typing import Annotated, ClassVar, assert_never
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from domain.errors import Conflict, CorruptHistory, Invalid, NotFound
from domain.messages import Command, CommandRejected, Event

__all__ = [
    "CONTENT_HOLDER_PREFIX",
    "AnyVolumeCommand",
    "AnyVolumeEvent",
    "AttachVolume",
    "CreateVolume",
    "DestroyVolume",
    "ReleaseVolume",
    "Volume",
    "VolumeAttached",
    "VolumeCommand",
    "VolumeCreated",
    "VolumeDestroyed",
    "VolumeId",
    "VolumeName",
    "VolumeReleased",
    "VolumeVersion",
    "check_mount_path",
    "decide_volume",
    "evolve_volume",
    "fold_volume",
    "holder_label",
    "is_volume_name",
    "volume_id_of",
]

#: Volume ids are subject tokens and path segments: lowercase base32, like sandbox ids.
VolumeId = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]{1,63}$")]
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
#: E2B's volume names: letters, digits, `.`, `_`, `-`, up to 63 characters.
VolumeName = Annotated[str, StringConstraints(pattern=_NAME)]
#: A holder that is a write through the content API, not a sandbox (sandbox ids have no
#: `-`, so the two never meet).
CONTENT_HOLDER_PREFIX = "content-"
_ID_LEN = 20
_RECENT = 16


def volume_id_of(team_id: str, name: str) -> str:
    """The id of volume `name` of `team_id`: the same on every API and in every pipeline."""
    digest = hashlib.sha256(f"volume|{team_id}|{name}".encode()).digest()
    return base64.b32encode(digest).decode().lower()[:_ID_LEN]


def is_volume_name(name: str) -> bool:
    return bool(re.match(_NAME, name))


def holder_label(holder: str) -> str:
    """A holder as a user reads it in a refusal."""
    if holder.startswith(CONTENT_HOLDER_PREFIX):
        return "a write through the volume API"
    return f"sandbox {holder}"


class VolumeVersion(BaseModel):
    """One durable content of a volume: the repository's key for its image, what the
    image's chunks take there, and the node that keeps a copy of it on its disk (creates
    that mount the volume prefer it: no download)."""

    model_config = ConfigDict(frozen=True)

    key: str = Field(min_length=1)
    size_bytes: int = Field(ge=0)
    node_id: str | None = None


class VolumeCommand(Command):
    """A command addressed to one volume aggregate."""

    aggregate: ClassVar[str] = "volume"
    aggregate_field: ClassVar[str] = "volume_id"

    volume_id: VolumeId


class CreateVolume(VolumeCommand):
    """`POST /volumes`. The token is minted at the edge; the log keeps its sha256 only."""

    creates: ClassVar[bool] = True

    team_id: str = Field(min_length=1)
    name: VolumeName
    token_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class DestroyVolume(VolumeCommand):
    """`DELETE /volumes/{id}`: refused while something holds it."""


class AttachVolume(VolumeCommand):
    """`holder` (a sandbox id, or a content write `content-…`) takes the volume on
    `node_id`. The same holder again is a no-op — or, from another node, a move (a paused
    sandbox taken over elsewhere). `replaces`: the holder the caller found gone for good
    (its sandbox ended on a node that is lost), whose unreleased writes are given up."""

    holder: str = Field(min_length=1)
    node_id: str | None = None
    replaces: str | None = None


class ReleaseVolume(VolumeCommand):
    """`holder` lets the volume go, its content now `version` (None: unchanged since the
    attach — nothing was written, or what was is lost). `node_id` None: a release on the
    holder's behalf (its node is gone)."""

    holder: str = Field(min_length=1)
    node_id: str | None = None
    version: VolumeVersion | None = None


#: The closed set of volume commands (`decide_volume` matches it exhaustively).
AnyVolumeCommand = CreateVolume | DestroyVolume | AttachVolume | ReleaseVolume


class VolumeEvent(Event):
    volume_id: str


class VolumeCreated(VolumeEvent):
    command_id: UUID
    team_id: str
    name: str
    token_sha256: str


class VolumeDestroyed(VolumeEvent):
    command_id: UUID


class VolumeAttached(VolumeEvent):
    command_id: UUID
    holder: str
    node_id: str | None = None
    #: the holder this attach took over from (gone for good), if any
    replaced: str | None = None


class VolumeReleased(VolumeEvent):
    command_id: UUID
    holder: str
    #: the content it was left with (None: the version before the attach)
    version: VolumeVersion | None = None
    #: released on the holder's behalf, not by its node
    forced: bool = False


AnyVolumeEvent = VolumeCreated | VolumeDestroyed | VolumeAttached | VolumeReleased
VOLUME_EVENTS = (VolumeCreated, VolumeDestroyed, VolumeAttached, VolumeReleased)


class Volume(BaseModel):
    """One volume as the write side sees it."""

    model_config = ConfigDict(frozen=True)

    volume_id: str
    team_id: str
    name: str
    token_sha256: str
    #: the create's command id: the token derives from it (a name created again after a
    #: destroy has another token)
    incarnation: UUID
    created_at: datetime
    destroyed: bool = False
    #: who has it attached (None: nobody), on which node, since when
    holder: str | None = None
    holder_node: str | None = None
    attached_at: datetime | None = None
    #: its latest durable content (None: never written, an empty file system)
    version: VolumeVersion | None = None
    recent_commands: tuple[UUID, ...] = ()

    @property
    def held(self) -> bool:
        return self.holder is not None

    def seen(self, command_id: UUID) -> bool:
        return command_id in self.recent_commands


def decide_volume(state: Volume | None, command: AnyVolumeCommand) -> list[Event]:
    """Create: a new name (or one destroyed before); destroy: only when nobody holds it;
    attach: exclusive; release: only by the current holder (and its node). A command
    already accepted decides nothing."""
    if state is not None and state.seen(command.command_id):
        return []
    vid, at, cid = command.volume_id, command.at, command.command_id
    match command:
        case CreateVolume():
            if state is not None and not state.destroyed:
                raise Conflict(f"volume '{command.name}' already exists")
            return [
                VolumeCreated(
                    volume_id=vid,
                    command_id=cid,
                    team_id=command.team_id,
                    name=command.name,
                    token_sha256=command.token_sha256,
                    at=at,
                )
            ]
        case DestroyVolume():
            live = _live(state, vid)
            if live.holder is not None:
                raise Conflict(
                    f"volume '{live.name}' is in use by {holder_label(live.holder)}: "
                    "kill the sandbox first (a volume is destroyed only when "
                    "nothing mounts it)"
                )
            return [VolumeDestroyed(volume_id=vid, command_id=cid, at=at)]
        case AttachVolume():
            live = _live(state, vid)
            if live.holder == command.holder:
                if command.node_id in (None, live.holder_node):
                    return []
                return [
                    VolumeAttached(
                        volume_id=vid,
                        command_id=cid,
                        holder=command.holder,
                        node_id=command.node_id,
                        at=at,
                    )
                ]
            if live.holder is not None and live.holder != command.replaces:
                raise Conflict(
                    f"volume '{live.name}' is in use by "
                    f"{holder_label(live.holder)}: a volume is mounted by one "
                    "sandbox at a time"
                )
            return [
                VolumeAttached(
                    volume_id=vid,
                    command_id=cid,
                    holder=command.holder,
                    node_id=command.node_id,
                    replaced=live.holder,
                    at=at,
                )
            ]
        case ReleaseVolume():
            if state is None or state.destroyed or state.holder != command.holder:
                return []  # moot: released already, or taken over
            if command.node_id is not None and state.holder_node not in (None, command.node_id):
                return []  # a node that no longer has it (the holder moved on)
            return [
                VolumeReleased(
                    volume_id=vid,
                    command_id=cid,
                    holder=command.holder,
                    version=command.version,
                    forced=command.node_id is None,
                    at=at,
                )
            ]
        case _:
            assert_never(command)


def _live(state: Volume | None, volume_id: str) -> Volume:
    if state is None or state.destroyed:
        raise NotFound(f"volume {volume_id} not found")
    return state


def evolve_volume(state: Volume | None, event: Event) -> Volume | None:
    if isinstance(event, CommandRejected):
        return state
    if not isinstance(event, VOLUME_EVENTS):
        raise CorruptHistory(f"not a volume event: {type(event).__name__}")
    after = _evolve(state, event)
    return after.model_copy(
        update={"recent_commands": (*after.recent_commands, event.command_id)[-_RECENT:]}
    )


def _evolve(state: Volume | None, event: AnyVolumeEvent) -> Volume:
    match event:
        case VolumeCreated():
            if state is not None and not state.destroyed:
                raise CorruptHistory(f"volume {event.volume_id} created twice")
            return Volume(
                volume_id=event.volume_id,
                team_id=event.team_id,
                name=event.name,
                token_sha256=event.token_sha256,
                incarnation=event.command_id,
                created_at=event.at,
            )
        case VolumeDestroyed():
            return _existing(state, event).model_copy(update={"destroyed": True})
        case VolumeAttached():
            return _existing(state, event).model_copy(
                update={
                    "holder": event.holder,
                    "holder_node": event.node_id,
                    "attached_at": event.at,
                }
            )
        case VolumeReleased():
            s = _existing(state, event)
            version = event.version if event.version is not None else s.version
            return s.model_copy(
                update={
                    "holder": None,
                    "holder_node": None,
                    "attached_at": None,
                    "version": version,
                }
            )
        case _:
            assert_never(event)


def _existing(state: Volume | None, event: VolumeEvent) -> Volume:
    if state is None:
        raise CorruptHistory(
            f"{type(event).__name__} of volume {event.volume_id} before it was created"
        )
    return state


def fold_volume(events: Iterable[Event], state: Volume | None = None) -> Volume | None:
    return reduce(evolve_volume, events, state)


def check_mount_path(path: str) -> str:
    """A mount point as a create names it: absolute, normalised, not the root."""
    if not path.startswith("/") or path == "/" or "\x00" in path:
        raise Invalid(f"volume mount path {path!r} must be an absolute path other than /")
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise Invalid(f"volume mount path {path!r} must not contain . or ..")
    return "/" + "/".join(parts)
