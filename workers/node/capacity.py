"""How much more a node can take: memory and vCPUs, each with its overcommit ratio, and a
cap on how many sandboxes it holds.

Placement is pull-based (design §9): a node pulls a create only while it has room, so the
fleet needs no scheduler of ours — whichever node has room takes the work. The ledger is
the node's own measure of that room: each sandbox it runs (or is starting) holds its size
— the vCPUs and memory its template asks for — until its VM goes; a paused sandbox holds
nothing (its RAM is a file on disk). Its `Room` goes out in every heartbeat, where the
API reads it to refuse a create no node can take at once, instead of queueing it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from bus import RetryableError
from domain import sandbox as sb
from workers.node.settings import NodeSettings

__all__ = [
    "Ledger",
    "Room",
    "Size",
    "cannot_hold",
    "host_memory_mib",
    "ledger_of",
    "no_disk_room",
    "no_room",
    "size_of",
]


@dataclass(frozen=True)
class Size:
    """What one sandbox asks of its node."""

    vcpus: int
    mem_mib: int


@dataclass(frozen=True)
class Room:
    """A node's budget (after overcommit) and what is left of it."""

    vcpus: int
    mem_mib: int
    sandboxes: int
    free_vcpus: int
    free_mem_mib: int
    free_sandboxes: int

    def fits(self, size: Size) -> bool:
        return (
            self.free_sandboxes >= 1
            and self.free_vcpus >= size.vcpus
            and self.free_mem_mib >= size.mem_mib
        )


class Ledger:
    """Sizes held by sandbox id. `take` checks and holds at once (creates run
    concurrently: each must see the others' holds), `release` gives a size back."""

    def __init__(
        self,
        *,
        vcpus: int,
        mem_mib: int,
        max_sandboxes: int,
        cpu_overcommit: float = 1.0,
        memory_overcommit: float = 1.0,
    ) -> None:
        self.vcpus = int(vcpus * cpu_overcommit)
        self.mem_mib = int(mem_mib * memory_overcommit)
        self.max_sandboxes = max_sandboxes
        self._held: dict[str, Size] = {}

    def room(self) -> Room:
        used_cpu = sum(s.vcpus for s in self._held.values())
        used_mem = sum(s.mem_mib for s in self._held.values())
        return Room(
            vcpus=self.vcpus,
            mem_mib=self.mem_mib,
            sandboxes=self.max_sandboxes,
            free_vcpus=max(0, self.vcpus - used_cpu),
            free_mem_mib=max(0, self.mem_mib - used_mem),
            free_sandboxes=max(0, self.max_sandboxes - len(self._held)),
        )

    def fits(self, size: Size, count: int = 1) -> bool:
        """Room for `count` more sandboxes of `size`."""
        room = self.room()
        return (
            room.free_sandboxes >= count
            and room.free_vcpus >= size.vcpus * count
            and room.free_mem_mib >= size.mem_mib * count
        )

    def take(self, sandbox_id: str, size: Size, *, force: bool = False) -> bool:
        """Hold `size` for the sandbox if it fits (or `force`: a node's own paused sandbox
        coming back, which it cannot refuse to another node). Holding again is a no-op."""
        if sandbox_id in self._held:
            return True
        if not force and not self.fits(size):
            return False
        self._held[sandbox_id] = size
        return True

    def release(self, sandbox_id: str) -> None:
        self._held.pop(sandbox_id, None)

    def holds(self, sandbox_id: str) -> bool:
        return sandbox_id in self._held


def host_memory_mib(meminfo: Path = Path("/proc/meminfo")) -> int:
    """The host's MemTotal in MiB."""
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    raise ValueError(f"no MemTotal in {meminfo}")


def size_of(spec: sb.SandboxSpec | sb.Sandbox | sb.CreateSandbox) -> Size:
    """What a sandbox asks of its node: its template's vCPUs and memory."""
    return Size(spec.cpu_count, spec.memory_mb)


def ledger_of(settings: NodeSettings) -> Ledger:
    """The node's room: its settings, else the host's own memory (less a reserve) and
    CPUs."""
    mem = settings.memory_mib
    if mem is None:
        mem = max(256, host_memory_mib() - settings.reserved_memory_mib)
    return Ledger(
        vcpus=settings.vcpus or os.cpu_count() or 1,
        mem_mib=mem,
        max_sandboxes=settings.capacity,
        cpu_overcommit=settings.cpu_overcommit,
        memory_overcommit=settings.memory_overcommit,
    )


def no_disk_room(node_id: str, template_id: str, need: int, room: int) -> RetryableError:
    """As `no_room`, for the disk (placement by disk): the create names what it needed."""
    return RetryableError(
        f"node {node_id} has no disk room for template {template_id}: needs {need} bytes, "
        f"has {room}",
        delay_s=0.25,
        final_code="unavailable",
    )


def cannot_hold(node_id: str, template_id: str, why: str) -> RetryableError:
    """As `no_disk_room`, when the template's fetch itself was refused (its bytes do not
    fit this node's disk, or are nowhere it can get them): another node may take it, at
    once — waiting would not change this node's answer. (A nak of a later delivery with a
    delay is also held ~10 s by a JetStream 2.9 consumer with a backoff list, past the
    API's placement timeout: seen on nats-server 2.9.10.) Its pull request is the newest,
    so the redelivery goes to a node that has been waiting."""
    return RetryableError(
        f"node {node_id} cannot take template {template_id}: {why}",
        delay_s=0,
        final_code="unavailable",
    )


def no_room(node_id: str, size: Size) -> RetryableError:
    """Another node may have the room: a short nak, and on the last delivery the create is
    refused as unavailable (the API answers 503)."""
    return RetryableError(
        f"node {node_id} has no room for {size.vcpus} vCPU / {size.mem_mib} MiB",
        delay_s=0.25,
        final_code="unavailable",
    )
