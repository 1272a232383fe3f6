"""Value objects of the sandbox aggregate: status, lifecycle, network policy, ids, policy."""

from __future__ import annotations

import base64
import hashlib
import secrets
from enum import StrEnum
from typing import Annotated, Literal
from uuid import UUID, uuid5

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

__all__ = [
    "ID_NAMESPACE",
    "MAX_VOLUME_MOUNTS",
    "Lifecycle",
    "NetworkPolicy",
    "Policy",
    "PublicState",
    "SandboxId",
    "SandboxStatus",
    "VolumeMount",
    "derived_command_id",
    "derived_sandbox_id",
    "fork_child_ids",
    "new_sandbox_id",
    "public_state",
]

# E2B's proxy routes `{port}-{id}.{domain}`, so ids must be DNS-label safe (infra: [a-z0-9]+).
SandboxId = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]{1,63}$")]

#: Namespace of every id we derive deterministically (fork children, timer commands).
ID_NAMESPACE = UUID("6f0c7b8e-3c1a-4f43-9d2e-a3e5c0d1b7a4")

_ID_LEN = 20  # infra generates 20 characters; base32 of 100 bits


class SandboxStatus(StrEnum):
    """Where a sandbox is in its lifecycle (design §4)."""

    CREATING = "creating"
    RUNNING = "running"
    PAUSING = "pausing"
    PAUSED = "paused"
    RESUMING = "resuming"
    SNAPSHOTTING = "snapshotting"
    FORKING = "forking"
    KILLING = "killing"
    KILLED = "killed"
    FAILED = "failed"


PublicState = Literal["running", "paused"]

_PUBLIC: dict[SandboxStatus, PublicState] = {
    SandboxStatus.RUNNING: "running",
    SandboxStatus.SNAPSHOTTING: "running",
    SandboxStatus.FORKING: "running",
    SandboxStatus.PAUSING: "paused",
    SandboxStatus.PAUSED: "paused",
    SandboxStatus.RESUMING: "paused",
}


def public_state(status: SandboxStatus) -> PublicState | None:
    """E2B's two-valued view of a status; None for states E2B never shows (creating, killed…)."""
    return _PUBLIC.get(status)


class Lifecycle(BaseModel):
    """What happens at TTL expiry and on traffic to a paused sandbox (E2B `lifecycle`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    on_timeout: Literal["kill", "pause"] = "kill"
    auto_resume: bool = False
    #: on_timeout pause: with the guest's memory (True), or its disk only (E2B's
    #: `keep_memory=False`, the create's `autoPauseMemory`)
    pause_memory: bool = True


class NetworkPolicy(BaseModel):
    """Egress rules enforced in the sandbox's network namespace; ingress by the proxy:
    `allow_public_traffic` off means guest ports need the sandbox's traffic access token."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    allow_internet_access: bool = True
    allow_public_traffic: bool = True
    allow_out: tuple[str, ...] = ()
    deny_out: tuple[str, ...] = ()


#: Volumes one sandbox may mount: every VM has this many volume slots (block devices
#: attached at boot, each given a volume's image on restore; `docs/volumes.md`).
MAX_VOLUME_MOUNTS = 4


class VolumeMount(BaseModel):
    """A volume mounted into a sandbox at `path` (E2B's `volumeMounts[]`: `name`, `path`),
    with the id its name stands for (`domain.volume.volume_id_of`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    path: str = Field(min_length=1)
    volume_id: str = Field(pattern=r"^[a-z0-9]{1,63}$")


class Policy(BaseModel):
    """Limits `decide` enforces; operators configure them, E2B's ceilings bound them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_fork_count: int = Field(default=16, ge=1, le=100)
    min_timeout_s: int = Field(default=1, ge=1)
    # 24 h: E2B's Pro ceiling; a longer-lived sandbox should be paused and resumed instead.
    max_timeout_s: int = Field(default=86_400, ge=1)


def _b32_id(digest: bytes) -> str:
    return base64.b32encode(digest).decode().lower()[:_ID_LEN]


def new_sandbox_id() -> str:
    """A fresh random sandbox id, for edges that mint them (the API)."""
    return _b32_id(secrets.token_bytes(16))


def derived_sandbox_id(seed: str) -> str:
    """A sandbox id that follows from `seed` (a client's idempotency key, a build id): the
    same seed names the same sandbox on every retry and every replica."""
    return _b32_id(hashlib.sha256(seed.encode()).digest())


def fork_child_ids(command_id: UUID, count: int) -> tuple[str, ...]:
    """Child ids of one fork, derived from its command id so a redelivered fork reuses them."""
    return tuple(
        _b32_id(hashlib.sha256(f"{command_id}/{i}".encode()).digest()) for i in range(count)
    )


def derived_command_id(*parts: str) -> UUID:
    """A uuid5 over `parts`: the same inputs give the same command id on every replica."""
    return uuid5(ID_NAMESPACE, "|".join(parts))
