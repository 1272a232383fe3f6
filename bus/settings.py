"""Bus settings, read once from the environment (`AENV_*`) by each composition root."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["BusSettings"]


class BusSettings(BaseSettings):
    """Where NATS is and how our streams are shaped."""

    model_config = SettingsConfigDict(env_prefix="AENV_", frozen=True, extra="ignore")

    nats_url: str = "nats://127.0.0.1:4222"
    #: Namespace for every stream, subject, KV bucket and durable name, so that several
    #: stacks (or test sessions) share one NATS server without colliding. Empty in production.
    bus_prefix: str = Field(default="", pattern=r"^[a-z0-9]*$", max_length=16)
    #: 1 on a single node, 3 in a cluster (design §3).
    replicas: int = Field(default=1, ge=1, le=5)
    #: JetStream dedup window. A command or event retried within it is stored once; it must
    #: exceed the longest client retry (the E2B SDK backs off up to ~10 s, 3 times).
    duplicate_window_s: float = Field(default=120.0, gt=0)
    #: Per-request timeout towards the server (publish acks, direct gets, API calls).
    request_timeout_s: float = Field(default=5.0, gt=0)
    #: How long a node's capacity entry in the KV bucket lives without a heartbeat.
    node_ttl_s: float = Field(default=30.0, gt=0)
    #: How long a secret handed to a worker (a build's registry password) is kept.
    secret_ttl_s: float = Field(default=3600.0, gt=0)
