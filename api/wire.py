"""E2B's control-plane REST types (e2b-compat §2), and nothing else.

camelCase on the wire, with E2B's one exception (`allow_internet_access` in create bodies).
Requests ignore fields we do not act on yet (E2B adds optional ones often; the SDK always
sends `metadata`/`envVars`), but every field we read is type-checked: a wrong type is a 400.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AliasChoices, BaseModel, ConfigDict, Field

_REQ = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)
_RESP = ConfigDict(populate_by_name=True, frozen=True)

#: Metadata is stored with the sandbox and returned by every listing: labels, not payloads.
MAX_METADATA = 64 << 10
#: Env vars go to every process in the sandbox; Linux caps one at 128 KiB (MAX_ARG_STRLEN).
MAX_ENV_VARS = 256 << 10


def _bounded(what: str, limit: int) -> AfterValidator:
    """A string map whose keys and values together fit in `limit` bytes of UTF-8."""

    def check(value: dict[str, str]) -> dict[str, str]:
        size = sum(len(k.encode()) + len(v.encode()) for k, v in value.items())
        if size > limit:
            raise ValueError(f"{what} take {size} bytes; at most {limit} are allowed")
        return value

    return AfterValidator(check)


class Error(BaseModel):
    """E2B's error body, the only one any route sends (`api.errors`)."""

    model_config = _RESP
    code: int
    message: str


class AutoResume(BaseModel):
    model_config = _REQ
    enabled: bool = False


class NetworkConfig(BaseModel):
    model_config = _REQ
    allow_public_traffic: bool | None = Field(None, alias="allowPublicTraffic")
    allow_out: list[str] = Field(default_factory=list, alias="allowOut")
    deny_out: list[str] = Field(default_factory=list, alias="denyOut")


class NetworkUpdate(BaseModel):
    """Body of `PUT /sandboxes/{id}/network` (E2B's `SandboxNetworkUpdateConfig`): the whole
    egress configuration, a field left out cleared (`allow_internet_access` back to true).
    The SDK sends `allow_internet_access` in snake_case, as in a create body. `rules`,
    `dnsServers`, `egressProxy` and `maskRequestHost` are ignored, as a create ignores them:
    aenv has no HTTPS transform proxy, DNS allowance or SOCKS egress. `allowPublicTraffic`
    (ingress) is no part of an update: it stays as created, with its traffic token."""

    model_config = _REQ
    allow_out: list[str] = Field(default_factory=list, alias="allowOut")
    deny_out: list[str] = Field(default_factory=list, alias="denyOut")
    allow_internet_access: bool | None = Field(
        None, validation_alias=AliasChoices("allow_internet_access", "allowInternetAccess")
    )


class VolumeMount(BaseModel):
    """One of a create's `volumeMounts`: volume `name` mounted at `path`."""

    model_config = _REQ
    name: str = Field(min_length=1, max_length=63)
    path: str = Field(min_length=1, max_length=1024)


class NewSandbox(BaseModel):
    """Body of `POST /v2/sandboxes` (and, with `secure`, of v1 `POST /sandboxes`)."""

    model_config = _REQ
    template_id: str = Field(alias="templateID", min_length=1, max_length=255, examples=["base"])
    timeout: int | None = None
    metadata: Annotated[dict[str, str], _bounded("metadata", MAX_METADATA)] = Field(
        default_factory=dict
    )
    env_vars: Annotated[dict[str, str], _bounded("envVars", MAX_ENV_VARS)] = Field(
        default_factory=dict, alias="envVars"
    )
    auto_pause: bool | None = Field(None, alias="autoPause")
    #: the timeout's pause keeps memory (absent: it does); false: a filesystem-only pause
    auto_pause_memory: bool | None = Field(None, alias="autoPauseMemory")
    auto_resume: AutoResume | None = Field(None, alias="autoResume")
    allow_internet_access: bool | None = None
    network: NetworkConfig | None = None
    secure: bool | None = None
    volume_mounts: list[VolumeMount] = Field(
        default_factory=list, alias="volumeMounts", max_length=16
    )


class TimeoutBody(BaseModel):
    model_config = _REQ
    timeout: int


class ConnectBody(BaseModel):
    model_config = _REQ
    timeout: int | None = None


class PauseBody(BaseModel):
    """`sbx.pause(keep_memory=False)` / `mode="filesystem"` sends `memory: false`."""

    model_config = _REQ
    memory: bool | None = None
    require_healthy_guest: bool | None = Field(None, alias="requireHealthyGuest")


class RefreshBody(BaseModel):
    model_config = _REQ
    duration: int | None = None


class SnapshotBody(BaseModel):
    model_config = _REQ
    name: str | None = None
    memory: bool | None = None


class ForkBody(BaseModel):
    model_config = _REQ
    timeout: int | None = None
    count: int | None = None


class SnapshotForkBody(ForkBody):
    """`POST /snapshots/{id}/fork`: E2B's fork request, and (aenv's) the children's
    metadata — a lease (`aenv.lease`) or a run's labels for the bulk routes."""

    metadata: Annotated[dict[str, str], _bounded("metadata", MAX_METADATA)] | None = None


class Sandbox(BaseModel):
    """Response of create/connect/resume."""

    model_config = _RESP
    template_id: str = Field(serialization_alias="templateID")
    sandbox_id: str = Field(serialization_alias="sandboxID")
    client_id: str = Field(serialization_alias="clientID")
    envd_version: str = Field(serialization_alias="envdVersion")
    alias: str | None = None
    envd_access_token: str | None = Field(None, serialization_alias="envdAccessToken")
    traffic_access_token: str | None = Field(None, serialization_alias="trafficAccessToken")
    domain: str | None = None


class Lifecycle(BaseModel):
    model_config = _RESP
    auto_resume: bool = Field(serialization_alias="autoResume")
    on_timeout: Literal["kill", "pause"] = Field(serialization_alias="onTimeout")


class MountedVolume(BaseModel):
    model_config = _RESP
    name: str
    path: str


class ListedSandbox(BaseModel):
    model_config = _RESP
    template_id: str = Field(serialization_alias="templateID")
    sandbox_id: str = Field(serialization_alias="sandboxID")
    client_id: str = Field(serialization_alias="clientID")
    started_at: datetime = Field(serialization_alias="startedAt")
    end_at: datetime = Field(serialization_alias="endAt")
    envd_version: str = Field(serialization_alias="envdVersion")
    cpu_count: int = Field(serialization_alias="cpuCount")
    memory_mb: int = Field(serialization_alias="memoryMB")
    disk_size_mb: int = Field(serialization_alias="diskSizeMB")
    state: Literal["running", "paused"]
    alias: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    #: not in E2B's, for a paused sandbox only: when it was paused, and the seconds it runs
    #: once resumed without a new timeout (`domain.sandbox.ttl_on_resume`) — its `endAt` is
    #: the end it had when it was paused, which paused time does not bring closer
    paused_at: datetime | None = Field(None, serialization_alias="pausedAt")
    remaining_s: int | None = Field(None, serialization_alias="remainingS")
    volume_mounts: list[MountedVolume] = Field(
        default_factory=list, serialization_alias="volumeMounts"
    )
    #: not in E2B's: the node that runs it or holds its pause (`aenv ls --node`; a drain)
    node_id: str | None = Field(None, serialization_alias="nodeID")


class SandboxNetwork(BaseModel):
    """E2B's `SandboxNetworkConfig` as `GET /sandboxes/{id}` shows it (what we enforce)."""

    model_config = _RESP
    allow_public_traffic: bool = Field(serialization_alias="allowPublicTraffic")
    allow_out: list[str] = Field(default_factory=list, serialization_alias="allowOut")
    deny_out: list[str] = Field(default_factory=list, serialization_alias="denyOut")


class SandboxDetail(ListedSandbox):
    envd_access_token: str | None = Field(None, serialization_alias="envdAccessToken")
    #: not in E2B's SandboxDetail (its create and connect answers carry it): ours shows it
    #: too, to the same caller that may connect and read it there
    traffic_access_token: str | None = Field(None, serialization_alias="trafficAccessToken")
    network: SandboxNetwork | None = None
    domain: str | None = None
    allow_internet_access: bool | None = Field(None, serialization_alias="allowInternetAccess")
    lifecycle: Lifecycle | None = None
    forked_from: str | None = Field(None, serialization_alias="forkedFrom")
    #: not in E2B's: when its guest last filled its own root disk (`SandboxDiskFull`; its
    #: writes fail, envd's uploads answer 507); omitted when it never did
    disk_full_at: datetime | None = Field(None, serialization_alias="diskFullAt")


class NewVolume(BaseModel):
    """Body of `POST /volumes`."""

    model_config = _REQ
    name: str = Field(min_length=1, max_length=63)


class Volume(BaseModel):
    """E2B's `Volume` (a listing's item)."""

    model_config = _RESP
    volume_id: str = Field(serialization_alias="volumeID")
    name: str


class VolumeAndToken(Volume):
    """E2B's `VolumeAndToken`: what create and get answer; `token` authorises the volume's
    content API (`Authorization: Bearer`)."""

    token: str


def dump(model: BaseModel) -> dict[str, Any]:
    """Wire JSON of a response model: aliases, no nulls for optional fields E2B omits."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)
