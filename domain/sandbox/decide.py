"""The sandbox aggregate's behaviour: `decide` (command → events); the fold is in `evolve`.

Both are pure: no clock (times come from the command's `at`), no randomness (ids derive from
the command id), no I/O. `decide` raises only `domain.errors` exceptions. Benign repeats
(pausing a paused sandbox, a redelivered command) decide no events rather than failing.
"""

from __future__ import annotations

from datetime import timedelta
from typing import assert_never

from domain.errors import Conflict, Invalid, NotFound
from domain.sandbox.commands import (
    AnySandboxCommand,
    CreateSandbox,
    ForkSandbox,
    KillSandbox,
    PauseSandbox,
    ResumeSandbox,
    SetSandboxTimeout,
    SnapshotSandbox,
    UpdateSandboxNetwork,
)
from domain.sandbox.complete import decide_completion
from domain.sandbox.events import (
    SandboxEvent,
    SandboxForkRequested,
    SandboxKillRequested,
    SandboxPauseRequested,
    SandboxRequested,
    SandboxResumeRequested,
    SandboxTimeoutSet,
    SnapshotRequested,
)
from domain.sandbox.evolve import State
from domain.sandbox.network import check_egress, update_network
from domain.sandbox.state import Sandbox
from domain.sandbox.values import MAX_VOLUME_MOUNTS, Policy, SandboxStatus, fork_child_ids
from domain.volume import check_mount_path

__all__ = ["DEFAULT_POLICY", "State", "decide"]

DEFAULT_POLICY = Policy()

S = SandboxStatus
#: States in which the VM runs and its TTL clock ticks.
_LIVE = frozenset({S.RUNNING, S.SNAPSHOTTING, S.FORKING})

# Resource bounds: a request outside them is a client error, not a placement problem.
_CPU = (1, 64)
_MEMORY_MB = (128, 256 * 1024)

#: What a client asks of a sandbox (through the API).
_Request = (
    CreateSandbox
    | PauseSandbox
    | ResumeSandbox
    | KillSandbox
    | SetSandboxTimeout
    | ForkSandbox
    | SnapshotSandbox
    | UpdateSandboxNetwork
)


def decide(
    state: State, command: AnySandboxCommand, policy: Policy = DEFAULT_POLICY
) -> list[SandboxEvent]:
    """Events that carrying out `command` on `state` produces (possibly none)."""
    if state is not None and state.sandbox_id != command.sandbox_id:
        raise Invalid(f"command for {command.sandbox_id!r} given state of {state.sandbox_id!r}")
    if state is not None and state.seen(command.command_id):
        # A redelivery of a request the sandbox accepted: it had its outcome, or is having
        # it, whatever happened since — a resume delivered again after the sandbox it
        # brought back was killed must decide nothing, not be refused as "not found" (a
        # second outcome for one command).
        return []
    match command:
        case (
            CreateSandbox()
            | PauseSandbox()
            | ResumeSandbox()
            | KillSandbox()
            | SetSandboxTimeout()
            | ForkSandbox()
            | SnapshotSandbox()
            | UpdateSandboxNetwork()
        ):
            return _decide_request(state, command, policy)
        case _:  # what is left is a node's completion (mypy checks it is)
            return decide_completion(state, command)


def _decide_request(state: State, command: _Request, policy: Policy) -> list[SandboxEvent]:
    """A client's request (through the API): refused on a sandbox that does not exist."""
    match command:
        case CreateSandbox():
            return _create(state, command, policy)
        case PauseSandbox():
            return _pause(_existing(state), command)
        case ResumeSandbox():
            return _resume(_existing(state), command, policy)
        case KillSandbox():
            return _kill(_existing(state), command)
        case SetSandboxTimeout():
            return _set_timeout(_existing(state), command, policy)
        case ForkSandbox():
            return _fork(_existing(state), command, policy)
        case SnapshotSandbox():
            return _snapshot(_existing(state), command)
        case UpdateSandboxNetwork():
            return update_network(_existing(state), command)
        case _:
            assert_never(command)


def _existing(state: State) -> Sandbox:
    if state is None or state.status is S.KILLED:
        raise NotFound("sandbox not found")
    return state


def _check_timeout(timeout_s: int, policy: Policy) -> None:
    if not policy.min_timeout_s <= timeout_s <= policy.max_timeout_s:
        raise Invalid(
            f"timeout must be between {policy.min_timeout_s} and {policy.max_timeout_s} "
            f"seconds, got {timeout_s}"
        )


def _check_range(name: str, value: int, bounds: tuple[int, int]) -> None:
    if not bounds[0] <= value <= bounds[1]:
        raise Invalid(f"{name} must be between {bounds[0]} and {bounds[1]}, got {value}")


def _check_ingress(c: CreateSandbox) -> None:
    """A sandbox closed to public traffic has a traffic token (the proxy lets no one in
    without it), and a public one none (it would be handed out yet never asked for)."""
    private = not c.network.allow_public_traffic
    if private and c.traffic_access_token is None:
        raise Invalid("allowPublicTraffic=false needs a traffic access token")
    if not private and c.traffic_access_token is not None:
        raise Invalid("a traffic access token is only for allowPublicTraffic=false")


def _check_volumes(c: CreateSandbox) -> None:
    """At most one volume per slot, each once, each at a path of its own (normalised)."""
    mounts = c.volume_mounts
    if len(mounts) > MAX_VOLUME_MOUNTS:
        raise Invalid(f"at most {MAX_VOLUME_MOUNTS} volumes can be mounted, got {len(mounts)}")
    paths = [check_mount_path(m.path) for m in mounts]
    if paths != [m.path for m in mounts]:
        raise Invalid(f"volume mount paths must be normalised: {[m.path for m in mounts]}")
    if len(set(paths)) != len(paths):
        raise Invalid("two volumes are mounted at the same path")
    nested = [p for p in paths for q in paths if p != q and p.startswith(q + "/")]
    if nested:
        raise Invalid(f"volume mount {nested[0]} is inside another volume's mount")
    if len({m.volume_id for m in mounts}) != len(mounts):
        raise Invalid("a volume can be mounted once per sandbox")


def _no_volumes(s: Sandbox, what: str) -> None:
    """A volume is an ext4 on one block device: a copy of the guest would be a second
    kernel writing it (fork), or a template whose every sandbox did (snapshot)."""
    if s.volume_mounts:
        names = ", ".join(m.name for m in s.volume_mounts)
        raise Conflict(
            f"cannot {what} a sandbox with volumes mounted ({names}): a volume "
            "is attached to one sandbox at a time, and its copies would share it"
        )


def _create(state: State, c: CreateSandbox, policy: Policy) -> list[SandboxEvent]:
    if state is not None:
        if state.seen(c.command_id):
            return []
        raise Conflict(f"sandbox {c.sandbox_id} already exists")
    _check_timeout(c.timeout_s, policy)
    _check_range("cpuCount", c.cpu_count, _CPU)
    _check_range("memoryMB", c.memory_mb, _MEMORY_MB)
    if c.disk_size_mb < 1:
        raise Invalid(f"diskSizeMB must be positive, got {c.disk_size_mb}")
    _check_ingress(c)
    check_egress(c.network.allow_out, c.network.deny_out)
    _check_volumes(c)
    return [
        SandboxRequested(sandbox_id=c.sandbox_id, at=c.at, command_id=c.command_id, spec=c.spec)
    ]


def _pause(s: Sandbox, c: PauseSandbox) -> list[SandboxEvent]:
    if s.seen(c.command_id) or s.status in (S.PAUSING, S.PAUSED):
        return []  # already done or under way: pausing twice is benign
    if s.status is not S.RUNNING:
        raise Conflict(f"cannot pause a sandbox that is {s.status}")
    return [
        SandboxPauseRequested(
            sandbox_id=s.sandbox_id,
            at=c.at,
            command_id=c.command_id,
            reason=c.reason,
            keep_memory=c.keep_memory,
        )
    ]


def _resume(s: Sandbox, c: ResumeSandbox, policy: Policy) -> list[SandboxEvent]:
    if c.timeout_s is not None:
        _check_timeout(c.timeout_s, policy)
    if s.seen(c.command_id):
        return []
    if s.status is S.RESUMING:
        # another request is resuming it: that one's node does it and answers it; this one
        # is refused rather than joined (two answers for one resume), and its caller waits
        # the other out (`api.resume`)
        raise Conflict("sandbox is already being resumed by another request")
    if s.status is not S.PAUSED:
        raise Conflict(f"cannot resume a sandbox that is {s.status}")
    return [
        SandboxResumeRequested(
            sandbox_id=s.sandbox_id,
            at=c.at,
            command_id=c.command_id,
            timeout_s=c.timeout_s,
            node_id=c.node_id,
        )
    ]


def _kill(s: Sandbox, c: KillSandbox) -> list[SandboxEvent]:
    if s.seen(c.command_id) or s.status is S.KILLING:
        return []
    return [
        SandboxKillRequested(
            sandbox_id=s.sandbox_id, at=c.at, command_id=c.command_id, reason=c.reason
        )
    ]


def _set_timeout(s: Sandbox, c: SetSandboxTimeout, policy: Policy) -> list[SandboxEvent]:
    _check_timeout(c.timeout_s, policy)
    if s.seen(c.command_id):
        return []
    if s.status in _LIVE:
        end_at = c.at + timedelta(seconds=c.timeout_s)
        if c.extend_only and s.end_at is not None and end_at <= s.end_at:
            return []
        return [
            SandboxTimeoutSet(
                sandbox_id=s.sandbox_id,
                at=c.at,
                command_id=c.command_id,
                timeout_s=c.timeout_s,
                end_at=end_at,
            )
        ]
    if s.status is S.PAUSED:
        if c.extend_only and (s.remaining_s or 0) >= c.timeout_s:
            return []
        return [
            SandboxTimeoutSet(
                sandbox_id=s.sandbox_id,
                at=c.at,
                command_id=c.command_id,
                timeout_s=c.timeout_s,
                end_at=None,
            )
        ]
    raise Conflict(f"cannot set the timeout of a sandbox that is {s.status}")


def _fork(s: Sandbox, c: ForkSandbox, policy: Policy) -> list[SandboxEvent]:
    if not 1 <= c.count <= policy.max_fork_count:
        raise Invalid(f"fork count must be between 1 and {policy.max_fork_count}, got {c.count}")
    _check_timeout(c.timeout_s, policy)
    if s.seen(c.command_id):
        return []
    if s.status is not S.RUNNING:
        raise Conflict(f"cannot fork a sandbox that is {s.status}")
    _no_volumes(s, "fork")
    return [
        SandboxForkRequested(
            sandbox_id=s.sandbox_id,
            at=c.at,
            command_id=c.command_id,
            child_ids=fork_child_ids(c.command_id, c.count),
            timeout_s=c.timeout_s,
        )
    ]


def _snapshot(s: Sandbox, c: SnapshotSandbox) -> list[SandboxEvent]:
    if s.seen(c.command_id):
        return []
    if s.status is not S.RUNNING:
        raise Conflict(f"cannot snapshot a sandbox that is {s.status}")
    _no_volumes(s, "snapshot")
    return [
        SnapshotRequested(
            sandbox_id=s.sandbox_id, at=c.at, command_id=c.command_id, snapshot_id=c.snapshot_id
        )
    ]
