"""What a sandbox is asked to be: one value object, written once.

The create command is a spec with an id (`CreateSandbox`), the `SandboxRequested` event
carries the spec it accepted, and the state starts as that spec (`Sandbox` holds its fields,
of which `node_id` and `timeout_s` later change: where it runs, the last full timeout). A
fork child's create is its parent's spec with the fork's timeout and lineage.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from domain.sandbox.values import Lifecycle, NetworkPolicy, SandboxId, VolumeMount

__all__ = ["SPEC_FIELDS", "SandboxSpec", "upcast_requested_v1"]


class SandboxSpec(BaseModel):
    model_config = ConfigDict(frozen=True)

    template_id: str = Field(min_length=1)
    alias: str | None = None
    team_id: str | None = None
    api_key_id: str | None = None
    cpu_count: int = 2
    memory_mb: int = 512
    disk_size_mb: int = 2048
    envd_version: str = "0.6.13"
    envd_access_token: str | None = None
    #: E2B's `trafficAccessToken`: what a request to a guest port other than envd's must
    #: carry (`e2b-traffic-access-token`) when `network.allow_public_traffic` is off; None
    #: for a public sandbox (and for every sandbox requested before it existed)
    traffic_access_token: str | None = None
    timeout_s: int = 300
    metadata: dict[str, str] = Field(default_factory=dict)
    env_vars: dict[str, str] = Field(default_factory=dict)
    lifecycle: Lifecycle = Lifecycle()
    network: NetworkPolicy = NetworkPolicy()
    forked_from: SandboxId | None = None
    #: volumes mounted into the guest, each attached to this sandbox alone while it lives
    #: (`domain/volume.py`); none for every sandbox requested before volumes existed
    volume_mounts: tuple[VolumeMount, ...] = ()
    node_id: str | None = Field(None, description="set by the node that placed it, if known")

    @property
    def spec(self) -> SandboxSpec:
        """Just the spec, of anything that is one (a create command, a sandbox's state)."""
        return SandboxSpec.model_validate(self.model_dump(include=set(SPEC_FIELDS)))


SPEC_FIELDS: tuple[str, ...] = tuple(SandboxSpec.model_fields)


def upcast_requested_v1(payload: dict[str, Any]) -> dict[str, Any]:
    """`SandboxRequested` v1 (the spec's fields flat beside `command_id`) → v2 (`spec`)."""
    spec = {k: payload.pop(k) for k in SPEC_FIELDS if k in payload}
    return {**payload, "spec": spec}
