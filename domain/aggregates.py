"""Every aggregate kind of aenv, described once: its name, state, decide/evolve and the
command and event types it owns.

The bus builds its stores, subject kinds and type registries from `AGGREGATES`, the
projections name the kind they fold by its entry, and the tests check each entry is wired
everywhere: a new kind is added here (and given a typed store on `bus.Bus`), nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Generic, TypeVar, get_args

from domain import apikey as ak
from domain import build as bd
from domain import buildkey as bk
from domain import image as im
from domain import lease as ls
from domain import node as nd
from domain import sandbox as sb
from domain import template as tp
from domain import volume as vo
from domain.messages import Command, Event

__all__ = [
    "AGGREGATES",
    "APIKEY",
    "BUILD",
    "BUILDKEY",
    "IMAGE",
    "LEASE",
    "NODE",
    "SANDBOX",
    "TEMPLATE",
    "VOLUME",
    "Aggregate",
    "AggregateKind",
    "Upcaster",
    "aggregate_of",
]

S = TypeVar("S")
C = TypeVar("C", bound=Command)
E = TypeVar("E", bound=Event)

#: A pure payload upgrade of one schema version step.
Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


class AggregateKind(StrEnum):
    """The aggregate kinds; each value is the kind's token in its event subjects
    (`aenv.evt.<kind>.<id>`) and its commands' `aggregate`: never renamed (the log has it)."""

    SANDBOX = "sandbox"
    TEMPLATE = "template"
    APIKEY = "apikey"
    BUILD = "build"
    VOLUME = "volume"
    IMAGE = "image"
    BUILDKEY = "buildkey"
    NODE = "node"
    LEASE = "lease"


@dataclass(frozen=True)
class Aggregate(Generic[S, C, E]):
    """One aggregate kind: the pure functions over its state `S`, deciding commands `C`
    into events `E`, and the message types the bus must know to carry them.

    `commands` are the types the bus may publish and read for this kind — not always the
    ones `decide` takes: some address the kind but are work for a worker that is never
    decided (a template's `ImportTemplateImage`), others are decided only inside the one
    process that issues them and never travel (its `CompleteTemplateImport`)."""

    kind: AggregateKind
    state: type[S]
    decide: Callable[[S | None, C], Sequence[Event]]
    evolve: Callable[[S | None, Event], S | None]
    commands: tuple[type[Command], ...]
    events: tuple[type[E], ...]
    #: (event type, from schema version) → its upgrade to the next version, for old logs
    upcasters: Mapping[tuple[str, int], Upcaster] = field(default_factory=dict)


def _members(union: object) -> tuple[Any, ...]:
    """The classes of a closed union alias (`AnySandboxEvent`)."""
    return get_args(union)


SANDBOX: Aggregate[sb.Sandbox, sb.AnySandboxCommand, sb.AnySandboxEvent] = Aggregate(
    kind=AggregateKind.SANDBOX,
    state=sb.Sandbox,
    decide=sb.decide,
    evolve=sb.evolve,
    commands=_members(sb.AnySandboxCommand),
    events=_members(sb.AnySandboxEvent),
    upcasters={("SandboxRequested", 1): sb.upcast_requested_v1},
)

TEMPLATE: Aggregate[tp.Template, tp.AnyTemplateCommand, tp.AnyTemplateEvent] = Aggregate(
    kind=AggregateKind.TEMPLATE,
    state=tp.Template,
    decide=tp.decide_template,
    evolve=tp.evolve_template,
    commands=(
        *(c for c in _members(tp.AnyTemplateCommand) if c is not tp.CompleteTemplateImport),
        tp.ImportTemplateImage,
    ),
    events=_members(tp.AnyTemplateEvent),
)

APIKEY: Aggregate[ak.ApiKey, ak.AnyApiKeyCommand, ak.AnyApiKeyEvent] = Aggregate(
    kind=AggregateKind.APIKEY,
    state=ak.ApiKey,
    decide=ak.decide_api_key,
    evolve=ak.evolve_api_key,
    commands=_members(ak.AnyApiKeyCommand),
    events=_members(ak.AnyApiKeyEvent),
)

BUILD: Aggregate[bd.Build, bd.AnyBuildCommand, bd.AnyBuildEvent] = Aggregate(
    kind=AggregateKind.BUILD,
    state=bd.Build,
    decide=bd.decide_build,
    evolve=bd.evolve_build,
    commands=_members(bd.AnyBuildCommand),
    events=_members(bd.AnyBuildEvent),
)

VOLUME: Aggregate[vo.Volume, vo.AnyVolumeCommand, vo.AnyVolumeEvent] = Aggregate(
    kind=AggregateKind.VOLUME,
    state=vo.Volume,
    decide=vo.decide_volume,
    evolve=vo.evolve_volume,
    commands=_members(vo.AnyVolumeCommand),
    events=_members(vo.AnyVolumeEvent),
)

IMAGE: Aggregate[im.Image, im.AnyImageCommand, im.AnyImageEvent] = Aggregate(
    kind=AggregateKind.IMAGE,
    state=im.Image,
    decide=im.decide_image,
    evolve=im.evolve_image,
    commands=_members(im.AnyImageCommand),
    events=_members(im.AnyImageEvent),
)


BUILDKEY: Aggregate[bk.BuildKey, bk.AnyBuildKeyCommand, bk.AnyBuildKeyEvent] = Aggregate(
    kind=AggregateKind.BUILDKEY,
    state=bk.BuildKey,
    decide=bk.decide_build_key,
    evolve=bk.evolve_build_key,
    commands=_members(bk.AnyBuildKeyCommand),
    events=_members(bk.AnyBuildKeyEvent),
)

NODE: Aggregate[nd.Node, nd.AnyNodeCommand, nd.AnyNodeEvent] = Aggregate(
    kind=AggregateKind.NODE,
    state=nd.Node,
    decide=nd.decide_node,
    evolve=nd.evolve_node,
    commands=_members(nd.AnyNodeCommand),
    events=_members(nd.AnyNodeEvent),
)

LEASE: Aggregate[ls.Lease, ls.AnyLeaseCommand, ls.AnyLeaseEvent] = Aggregate(
    kind=AggregateKind.LEASE,
    state=ls.Lease,
    decide=ls.decide_lease,
    evolve=ls.evolve_lease,
    commands=_members(ls.AnyLeaseCommand),
    events=_members(ls.AnyLeaseEvent),
)

#: Every aggregate kind, in the order they are listed everywhere else.
AGGREGATES: tuple[Aggregate[Any, Any, Any], ...] = (
    SANDBOX,
    TEMPLATE,
    APIKEY,
    BUILD,
    VOLUME,
    IMAGE,
    BUILDKEY,
    NODE,
    LEASE,
)

_BY_KIND: dict[str, Aggregate[Any, Any, Any]] = {a.kind: a for a in AGGREGATES}


def aggregate_of(kind: str) -> Aggregate[Any, Any, Any]:
    """The entry of a kind named by a subject token or a command's `aggregate`."""
    try:
        return _BY_KIND[kind]
    except KeyError:
        raise KeyError(f"no aggregate kind {kind!r}") from None
