"""The node aggregate: what an operator decided about a node, as opposed to what the node
says of itself (its heartbeat, in the nodes bucket).

Only the cordon lives here: a cordoned node takes no new sandboxes (it stops pulling
placed creates and resumes, and the API places nothing on it), while the sandboxes it holds
go on running until they are paused or killed — which is what a drain does with them
(`aenv node drain`). The cordon is history, not a live fact: it must survive the API, the
node and the bus restarting, so it is an event in the log (`aenv.evt.node.<id>`), folded
by the node (to stop pulling) and by the API (to stop sending resumes there).

A node needs no creation: cordoning a node that never beat is allowed (an operator may
fence a host before its first start), and uncordoning one never cordoned changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import reduce
from typing import ClassVar, assert_never

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from domain.errors import CorruptHistory
from domain.messages import Command, CommandRejected, Event

__all__ = [
    "AnyNodeCommand",
    "AnyNodeEvent",
    "CordonNode",
    "Node",
    "NodeCommand",
    "NodeCordoned",
    "NodeUncordoned",
    "UncordonNode",
    "decide_node",
    "evolve_node",
    "fold_node",
    "is_cordoned",
]


class NodeCommand(Command):
    """A command addressed to one node aggregate (an operator's, never a node's own)."""

    aggregate: ClassVar[str] = "node"
    aggregate_field: ClassVar[str] = "node_id"

    node_id: str = Field(min_length=1)


class CordonNode(NodeCommand):
    """Take no new sandboxes on this node; `reason` is shown to operators (`drain`, …)."""

    reason: str = ""


class UncordonNode(NodeCommand):
    """Take new sandboxes on this node again."""


class NodeCordoned(Event):
    node_id: str
    reason: str = ""


class NodeUncordoned(Event):
    node_id: str


class Node(BaseModel):
    """An operator's decisions about one node."""

    model_config = ConfigDict(frozen=True)

    node_id: str
    cordoned: bool = False
    reason: str = ""
    #: when the current cordon began (None while uncordoned)
    cordoned_at: AwareDatetime | None = None


#: The closed set of node commands (`decide_node` matches it exhaustively).
AnyNodeCommand = CordonNode | UncordonNode
#: The closed set of node events (`evolve_node` matches it exhaustively).
AnyNodeEvent = NodeCordoned | NodeUncordoned


def is_cordoned(state: Node | None) -> bool:
    """Whether a node (None: one no operator ever addressed) takes no new sandboxes."""
    return state is not None and state.cordoned


def decide_node(state: Node | None, command: AnyNodeCommand) -> list[Event]:
    """Cordon and uncordon are idempotent: asking for the state a node is in decides
    nothing (a retried `aenv node cordon`, a drain of a node already cordoned)."""
    match command:
        case CordonNode():
            if is_cordoned(state):
                return []
            return [NodeCordoned(node_id=command.node_id, reason=command.reason, at=command.at)]
        case UncordonNode():
            if not is_cordoned(state):
                return []
            return [NodeUncordoned(node_id=command.node_id, at=command.at)]
        case _:
            assert_never(command)


def evolve_node(state: Node | None, event: Event) -> Node | None:
    if isinstance(event, CommandRejected):
        return state
    if not isinstance(event, NodeCordoned | NodeUncordoned):
        raise CorruptHistory(f"not a node event: {type(event).__name__}")
    return _evolve(state, event)


def _evolve(state: Node | None, event: AnyNodeEvent) -> Node:
    base = state or Node(node_id=event.node_id)
    match event:
        case NodeCordoned():
            return base.model_copy(
                update={"cordoned": True, "reason": event.reason, "cordoned_at": event.at}
            )
        case NodeUncordoned():
            return base.model_copy(update={"cordoned": False, "reason": "", "cordoned_at": None})
        case _:
            assert_never(event)


def fold_node(events: Iterable[Event], state: Node | None = None) -> Node | None:
    return reduce(evolve_node, events, state)
