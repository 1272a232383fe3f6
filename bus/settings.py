"""Bus settings, read once from the environment (`AENV_*`) by each composition root."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["BusSettings"]


class BusSettings(BaseSettings):
    """Where NATS is and how our streams are shaped."""

    model_config = SettingsConfigDict(env_prefix="AENV_", frozen=True, extra="ignore")

    #: One server, or several comma-separated (a cluster: the client fails over between
    #: them and learns the rest of the cluster from whichever it reaches).
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
    #: How long a publish (an event, a command) is retried while nothing can store it: a
    #: reconnect to another server, a cluster electing a stream leader (seconds, typically).
    #: The same message id each time, so a retry never stores a second copy.
    publish_retry_s: float = Field(default=20.0, gt=0)
    #: How long a node's capacity entry in the KV bucket lives without a heartbeat.
    node_ttl_s: float = Field(default=30.0, gt=0)
    #: A node silent this long is gone for good: the fleet's timer ends what was under way
    #: there (its running sandboxes killed as lost, its creates failed, its resumes back to
    #: paused) — unless no node beats at all, which says more about the timer's own link.
    node_lost_after_s: float = Field(default=60.0, gt=0)
    #: How long a secret handed to a worker (a build's registry password) is kept.
    secret_ttl_s: float = Field(default=3600.0, gt=0)
    #: Limits of the event log (AENV_EVT) in bytes and messages; 0: none, the default.
    #: The log refuses appends at its limit (never drops history), so a limit only moves
    #: the cliff — and JetStream reserves a byte limit from its store when the stream is
    #: made (a limit larger than the store is refused: err 10047), so no one default
    #: fits a laptop's `aenv up` and a cluster. Unlimited, the log is bounded by the
    #: servers' JetStream store; the fill is watched either way (`bus.setup`, the
    #: `aenv_jetstream_stream_*` series, deploy/prometheus/aenv-alerts.yml).
    event_max_bytes: int = Field(default=0, ge=0)
    event_max_msgs: int = Field(default=0, ge=0)
    #: Most commands AENV_CMD holds (0: no limit). A work queue grows only while its
    #: consumers stall (every node gone, a builder stuck): a million waiting commands
    #: (~1-2 KB each) is a fleet in trouble, and past that new commands are refused
    #: rather than taking the store the event log needs. Counted, not sized: a byte
    #: limit would be reserved from the store at start.
    command_max_msgs: int = Field(default=1_000_000, ge=0)

    @property
    def servers(self) -> list[str]:
        """`nats_url` as the client's server list."""
        return [u.strip() for u in self.nats_url.split(",") if u.strip()]

    def login(self) -> dict[str, str]:
        """The user and password (or token) the URLs carry, as client options. A cluster
        tells the client of its other servers, which the client adds to its pool without
        the URLs' logins (nats-py): reconnecting to one of those was refused
        ("Authorization Violation") until the login was given for every server."""
        for url in self.servers:
            parts = urlsplit(url if "://" in url else f"nats://{url}")
            if parts.username and parts.password is not None:
                return {"user": unquote(parts.username), "password": unquote(parts.password)}
            if parts.username:
                return {"token": unquote(parts.username)}
        return {}
