"""What a create or a resume is, as data: the two commands that bring a sandbox's VM up on
this node share one skeleton (`openings.py`), and a `Verb` holds all that differs between
them. The decisions the skeleton makes on the log's answers are pure functions here."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar
from uuid import UUID

from bus import MessageContext
from domain import sandbox as sb
from domain.sandbox import SandboxStatus as S
from workers.node.early import Starter

__all__ = ["Next", "Outcome", "Verb", "after_request", "failed_meanwhile", "killed_meanwhile"]

C = TypeVar("C", bound=sb.CreateSandbox | sb.ResumeSandbox)

#: What the host's work hands back: (error or None, the failure's code if it has one).
Outcome = tuple[str | None, sb.FailureCode | None]


class Next(Enum):
    """What the request's state, as the log decided it, leaves this node to do."""

    #: decided into the verb's status, this node's to do: the host's work and its completion
    WORK = "work"
    #: refused, a no-op, or finished elsewhere or otherwise: only an early VM to undo
    NOTHING = "nothing"
    #: a redelivery of a request that finished here: its route may not have made it
    REPUT = "reput"
    #: a create another node (or an API withdrawing it) took: its outcome is theirs
    TAKEN = "taken"


def after_request(
    state: sb.Sandbox | None, expect: S, node_id: str, *, claims: bool, request: UUID
) -> Next:
    """What the log's answer to a request means here. A request that `claims` its node (a
    create names the node that takes it) is this node's only if the log has this node. A
    resume is this request's only if the log's resume is: a redelivery of one answered
    before its node died finds a later request's resume under way, which is not its own."""
    if state is None:
        return Next.NOTHING
    if state.status is expect and (not claims or state.node_id == node_id):
        theirs = state.status is S.RESUMING and state.resuming_command not in (None, request)
        return Next.NOTHING if theirs else Next.WORK
    if state.status is S.RUNNING and state.node_id == node_id:
        return Next.REPUT
    if claims and state.status is expect:
        return Next.TAKEN
    return Next.NOTHING


def killed_meanwhile(error: str | None, events: Sequence[object], state: sb.Sandbox | None) -> bool:
    """Whether a VM that came up belongs to a sandbox killed while it did (its completion
    decided nothing): the VM must not outlive its sandbox."""
    return (
        error is None
        and not events
        and state is not None
        and state.status in (S.KILLING, S.KILLED, S.FAILED)
    )


def failed_meanwhile(error: str | None, events: Sequence[object], state: sb.Sandbox | None) -> bool:
    """Whether a VM that came up belongs to a resume the log failed while it did (the
    fleet's timer took this node for gone): its completion decided nothing and the sandbox
    is paused again, on the capture the VM was restored from. The resume is not recorded:
    the VM goes, and the capture stays as it was (the log's paused state)."""
    return error is None and not events and state is not None and state.status is S.PAUSED


@dataclass(frozen=True)
class Verb(Generic[C]):
    """A command that brings a sandbox's VM up on this node, as the skeleton runs it."""

    #: the status the request leaves the sandbox in when the host's work is this node's
    expect: S
    #: room for the VM taken, else a `RetryableError` raised (another node may take it)
    take: Callable[[C], None]
    #: what must be on this node before the request claims the sandbox, else a
    #: `RetryableError` raised (another node may take it): a create's template
    ready: Callable[[C], Awaitable[None]]
    #: what starts the VM while the request is appended, or None (no early start)
    early: Callable[[C], Starter | None]
    #: the host's work when nothing started early
    work: Callable[[C, sb.Sandbox, MessageContext], Awaitable[Outcome]]
    #: the completion decided once the host's work is done (or failed)
    complete: Callable[[C, str | None, sb.FailureCode | None], sb.AnySandboxCommand]
    #: what a failed append of the request undoes an early VM on (the rest leave it running)
    undo_on: type[BaseException]
    #: a redelivery that finished here keeps an early VM (a resume's capture is spent)
    keeps_early: bool
    #: the completion decided on the request's outcome, not on the store's last fold
    known: bool
    #: a VM that came up for a sandbox killed meanwhile is killed (`killed_meanwhile`)
    kill_late: bool
    #: told the sandbox is up here and its coming up recorded (a redelivery's too)
    recorded: Callable[[str], None]
    #: a request that claims its node (a create): another node's claim is watched
    watch_taken: Callable[[C, sb.Sandbox, MessageContext], Awaitable[None]] | None = None
    #: what undoes a VM that came up for a request the log failed meanwhile, instead of
    #: `recorded` (`failed_meanwhile`: a resume); None: nothing such (a create's failure
    #: is a kill's, `kill_late`)
    failed_late: Callable[[sb.Sandbox], Awaitable[None]] | None = None
