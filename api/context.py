"""What every request handler needs, built once per process by `create_app`."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.ext.asyncio import AsyncEngine

from api.admission_state import TEAM_LIMITS, AdmissionState
from api.auth import KeyChecker
from api.cache import LookupCache
from api.metrics import Metrics
from bus import Bus
from bus.nodes import NodeBook


class ApiSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AENV_", frozen=True, extra="ignore")

    #: Upper bound on waiting for a create (restore + envd ready), then 504 with the command.
    create_timeout_s: float = Field(default=120.0, gt=0)
    #: Upper bound on waiting for the import of an image a create names (`api/images.py`):
    #: pull, conversion and a first boot of a large image take minutes. The SDK gives up
    #: after its own request timeout (60 s) meanwhile; the import goes on regardless.
    image_create_timeout_s: float = Field(default=900.0, gt=0)
    #: How long a create sent to placement may wait for a node to take it; then the API
    #: withdraws it and answers 503 (`api/room.py`): a fleet with no room says so.
    placement_timeout_s: float = Field(default=10.0, gt=0)
    #: Most children one fork of a snapshot may ask for (`api/snapfork.py`; E2B's bound).
    snapshot_fork_max: int = Field(default=100, ge=1, le=1000)
    #: Room a create keeps free on a node's disk beyond what it fetches there (the nodes'
    #: `AENV_DISK_HEADROOM_BYTES`, one variable for both): no node with that much room →
    #: 503 naming the disk (`bus/diskroom.py`).
    disk_headroom_bytes: int = Field(default=1 << 30, ge=0)
    #: Upper bound on waiting for other lifecycle outcomes (kill, pause, resume).
    command_timeout_s: float = Field(default=60.0, gt=0)
    #: Send sandbox traffic through the node's proxy instead of straight to the guest: what
    #: an API on another host than its nodes needs (a guest's address is node-local).
    proxy_via_node: bool = False
    #: `{port}-{id}.{domain}` host routing for the proxy; also returned as `domain`.
    sandbox_domain: str | None = None
    #: On TTL expiry: "pause" (aenv's default, nothing is lost) or "kill" (E2B's default).
    default_on_timeout: str = Field(default="pause", pattern=r"^(pause|kill)$")
    #: Where uploaded build-context archives go (`GET|PUT /templates/{id}/files/{hash}`);
    #: the template builder reads them from there. None: template file uploads are off.
    build_files_dir: Path | None = None
    #: Signs the upload links we hand out (the SDK PUTs to them without its API key).
    upload_secret: str = Field(default_factory=lambda: secrets.token_hex(16))
    #: A token Prometheus may scrape `/metrics` with (`Authorization: Bearer <token>`), so
    #: the scraper needs no API key (which could drive sandboxes). An API key works either
    #: way. None: API keys only.
    metrics_token: SecretStr | None = None
    #: Whether readiness needs a beating node (a one-machine stack: it cannot create
    #: without one). A fleet's APIs set it off: behind a load balancer, no node beating
    #: must not take every API out of service (readiness then warns instead).
    ready_needs_node: bool = True
    #: How long a template build's capture is kept after the last tag naming it moved or
    #: went, before the nodes drop it (`api/captures.py`): creates that resolved the tag a
    #: moment earlier — through another API's lookup cache (≤ 30 s), or waiting for room
    #: — still start it.
    capture_grace_s: float = Field(default=120.0, ge=0)
    #: How long a create waits for a volume its last holder (ended) is still releasing
    #: (uploading what it wrote), before it answers 409 with Retry-After.
    volume_wait_s: float = Field(default=30.0, ge=0)
    #: The stack's snapshot store (`AENV_S3_ENDPOINT`, set by the supervisor): readiness
    #: checks that it answers. None: the stack has none, nothing to check.
    s3_endpoint: str | None = None
    #: Admission control (`api/admission.py`): sandboxes a team may have running (0: no
    #: limit but the fleet's room), sandboxes per second it may start and how many at once
    #: (0: one second's worth), unless its key or `team_limits` says otherwise.
    team_max_sandboxes: int = Field(default=0, ge=0)
    team_creates_per_s: float = Field(default=0.0, ge=0)
    team_creates_burst: int = Field(default=0, ge=0)
    #: Per-team overrides, JSON: `{"team": {"max_sandboxes": 50, "creates_per_s": 10,
    #: "burst": 20}}` (any field left out: the defaults above).
    team_limits: str = ""
    #: Pipelines over NATS with least privilege (docs/pipelines.md): this API serves the
    #: teams' ingress (`aenv.in.<team>.<verb>`) and copies the sandbox events, secrets
    #: stripped, into the feed the teams' pipeline users and the auditor read. Off: no
    #: ingress and no feed (pipelines then need the stack's own NATS user, as before).
    pipelines: bool = True

    @field_validator("team_limits")
    @classmethod
    def _team_limits_parse(cls, v: str) -> str:
        TEAM_LIMITS.validate_json(v or "{}")  # a typo fails the API's start, not a create
        return v


WaitFor = Callable[[int], Awaitable[None]]


async def _no_wait(_: int) -> None:
    return None


@dataclass
class ApiContext:
    bus: Bus
    engine: AsyncEngine
    settings: ApiSettings
    keys: KeyChecker
    metrics: Metrics = field(default_factory=lambda: Metrics())
    #: Read-your-writes: returns once the sandboxes projection has folded stream seq `n`.
    wait_for: WaitFor = _no_wait
    #: The same for the templates projection (a deleted template or snapshot must be gone
    #: from listings once the DELETE answered).
    wait_for_templates: WaitFor = _no_wait
    #: The same for the volumes projection (a listing after a create shows it).
    wait_for_volumes: WaitFor = _no_wait
    #: Slowly changing lookups (templates, where a snapshot lives), off the create path.
    lookups: LookupCache = field(default_factory=LookupCache)
    #: Admission control's state in this process (`api/admission.py`).
    admission: AdmissionState = field(default_factory=AdmissionState)

    async def cached(self, key: str, load: Callable[[], Awaitable[Any]]) -> Any:
        return await self.lookups.get(key, load)

    def forget(self, prefix: str) -> None:
        self.lookups.forget(prefix)

    #: Node heartbeats (the role passes one that follows the bucket; else opened on first
    #: use and read per call).
    nodes: NodeBook | None = None

    async def node_book(self) -> NodeBook:
        if self.nodes is None:
            self.nodes = await NodeBook.open(self.bus.js, self.bus.names.nodes_bucket)
        return self.nodes

    async def node_gone(self, node_id: str) -> bool:
        """Whether a node stopped beating."""
        return await (await self.node_book()).gone(node_id)

    async def fenced_to(self, sandbox_id: str) -> None:
        """Before reading one sandbox: wait until the read model shows its latest event,
        whichever API process wrote it (behind a load balancer, a client's create and its
        next GET meet different APIs). One version check on the log."""
        seq = (await self.bus.sandboxes.version(sandbox_id)).seq
        if seq:
            await self.wait_for(seq)

    async def fenced_to_tail(self) -> None:
        """Before a listing: wait until the read model shows every sandbox event the log
        held when the request came, whichever API wrote it. (The sandboxes' latest, not the
        stream's: the projection never sees a key's or a template's events, and waiting
        for one of those timed the listing out.)"""
        seq = await self.bus.sandboxes.tail_seq()
        if seq:
            await self.wait_for(seq)
