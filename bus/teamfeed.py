"""The feed: every sandbox event republished under its team with its secrets stripped,
for those who may read the log but not every sandbox's keys (docs/pipelines.md).

The event log's subjects name a sandbox, not its team, so NATS permissions cannot give a
team its own events out of `AENV_EVT`. This worker (in the API role) copies each sandbox
event to `aenv.feed.<team>.sandbox.<id>` in `AENV_FEED`, the team read from the sandbox's
`SandboxRequested` (never from a later event), with the envd and traffic access tokens
and the env var values taken out. The auditor reads the feed; a team's pipelines read
`AENV_TEAM_<team>`, a stream NATS itself fills from the feed's `aenv.feed.<team>.>`
(`ensure_team_stream`), so each team's permissions name one stream of its own.

Order: one sandbox's events reach the feed in its revision order, whichever API process
copies them (a fleet shares the durable consumer): an event is copied once its previous
revision is in the feed, else retried shortly. A copy is stored once (`Nats-Msg-Id` = the
event id), so a redelivery after a crash is harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import OrderedDict
from typing import Any, Final

from nats.errors import ConnectionClosedError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    StreamSource,
)
from nats.js.errors import NotFoundError

from bus.headers import EVENT_SEQ, MSG_ID
from bus.subjects import AggregateKind, Names, pipeline_team, team_token

__all__ = ["REDACTED", "SECRET_FIELDS", "TeamFeed", "ensure_team_stream", "strip_secrets"]

log = logging.getLogger(__name__)

#: Fields whose values are credentials to a sandbox: never in the feed.
SECRET_FIELDS: Final = frozenset({"envd_access_token", "traffic_access_token"})
#: What an env var's value reads as in the feed (its name stays: it says what was set).
REDACTED: Final = "<redacted>"
#: Sandboxes whose team the worker remembers (one lookup each past that).
_TEAMS_KEPT = 100_000
#: How often an event whose previous revision is not in the feed yet is retried, and after
#: how many deliveries it is copied anyway (a previous revision that can never come: the
#: feed must not stop for good on one sandbox).
_RETRY_S = 0.05
_GIVE_UP_DELIVERIES = 40


def strip_secrets(value: Any) -> Any:
    """`value` (a decoded envelope or any part of it) without access tokens and env var
    values, at any depth."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if k in SECRET_FIELDS:
                out[k] = None
            elif k == "env_vars" and isinstance(v, dict):
                out[k] = dict.fromkeys(v, REDACTED)
            else:
                out[k] = strip_secrets(v)
        return out
    if isinstance(value, list):
        return [strip_secrets(v) for v in value]
    return value


def _feed_config(names: Names, replicas: int) -> StreamConfig:
    return StreamConfig(
        name=names.feed_stream,
        description="aenv feed: sandbox events by team, secrets stripped (a copy of the log)",
        subjects=[names.all_feed],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        num_replicas=replicas,
        allow_direct=True,
        deny_delete=True,
    )


async def ensure_team_stream(
    js: JetStreamContext, names: Names, team: str, replicas: int = 1
) -> str:
    """`AENV_TEAM_<team>`: what the team's pipelines read, filled by NATS from the feed
    (from its first message: the team's whole history). Idempotent; the stream's name."""
    name = names.team_stream(pipeline_team(team))
    config = StreamConfig(
        name=name,
        description=f"aenv feed of team {team} (sourced from {names.feed_stream})",
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        num_replicas=replicas,
        allow_direct=True,
        deny_delete=True,
        sources=[StreamSource(name=names.feed_stream, filter_subject=names.team_feed(team))],
    )
    with contextlib.suppress(NotFoundError):
        await js.stream_info(name)
        return name
    await js.add_stream(_feed_config(names, replicas))  # the source must exist
    await js.add_stream(config)
    return name


class TeamFeed:
    """The worker that copies sandbox events into the feed (one per API process)."""

    def __init__(self, js: JetStreamContext, names: Names, *, replicas: int = 1, batch: int = 256):
        self.js, self.names, self.replicas, self.batch = js, names, replicas, batch
        self._teams: OrderedDict[str, str | None] = OrderedDict()
        #: feed subject → the last revision this process copied there
        self._copied: OrderedDict[str, int] = OrderedDict()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    async def start(self) -> None:
        await self.js.add_stream(_feed_config(self.names, self.replicas))  # same config: no-op
        self._sub = await self.js.pull_subscribe(
            self.names.events_of_kind(AggregateKind.SANDBOX),
            durable=self.names.feed_consumer,
            stream=self.names.event_stream,
            config=ConsumerConfig(
                ack_policy=AckPolicy.EXPLICIT,
                deliver_policy=DeliverPolicy.ALL,
                ack_wait=30,
                max_ack_pending=self.batch * 4,
            ),
        )
        self._task = asyncio.create_task(self._run(), name="team-feed")

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(Exception):
            await self._sub.unsubscribe()

    async def _run(self) -> None:
        while not self._stopping:
            try:
                msgs = await self._sub.fetch(self.batch, timeout=1)
            except (NatsTimeoutError, TimeoutError):
                continue
            except ConnectionClosedError:  # closed under us (nats-py turns a cancel into it)
                return
            except Exception:  # a reconnect: the consumer is durable, nothing is lost
                log.warning("team feed: fetch failed", exc_info=True)
                await asyncio.sleep(1)
                continue
            for msg in msgs:
                try:
                    await self._copy(msg)
                except Exception:
                    log.warning("team feed: copy of %s failed", msg.subject, exc_info=True)
                    with contextlib.suppress(Exception):
                        await msg.nak(delay=1)

    async def _copy(self, msg: Any) -> None:
        env = json.loads(msg.data)
        sid = self.names.aggregate_id_of(msg.subject)
        subject = self.names.feed(team_token(await self._team(sid, env)), sid)
        revision = int(env.get("aggregate_version") or 0)
        last = self._copied.get(subject)
        # (a `SandboxRequested` after a rejection starts the sandbox's subject in its team:
        # what came before it is elsewhere, under no team)
        if revision > 1 and last != revision - 1 and env.get("type") != "SandboxRequested":
            last = await self._revision_in_feed(subject)
            if last >= revision:  # copied already (by this process before a crash, or another)
                await msg.ack()
                return
            if last != revision - 1 and msg.metadata.num_delivered < _GIVE_UP_DELIVERIES:
                await msg.nak(delay=_RETRY_S)  # its predecessor is on its way
                return
        # No `Nats-Expected-Stream`: a stream that sources the feed keeps the headers, and
        # one naming the feed made the team's stream refuse every copy (seen here).
        await self.js.publish(
            subject,
            json.dumps(strip_secrets(env)).encode(),
            headers={
                MSG_ID: str(env.get("event_id")),
                EVENT_SEQ: str(msg.metadata.sequence.stream),
            },
        )
        self._remember(self._copied, subject, revision)
        await msg.ack()

    async def _revision_in_feed(self, subject: str) -> int:
        try:
            raw = await self.js.get_last_msg(self.names.feed_stream, subject, direct=True)
        except NotFoundError:
            return 0
        return int(json.loads(raw.data or b"{}").get("aggregate_version") or 0)

    async def _team(self, sandbox_id: str, env: dict[str, Any]) -> str | None:
        """The sandbox's team, from its `SandboxRequested` (v1 flat, v2 in `spec`)."""
        if env.get("type") == "SandboxRequested":
            self._remember(self._teams, sandbox_id, _team_of(env))
        if sandbox_id not in self._teams:
            try:
                raw = await self.js.get_msg(
                    self.names.event_stream,
                    seq=1,
                    subject=self.names.sandbox_events(sandbox_id),
                    next=True,
                )
                first = json.loads(raw.data or b"{}")
            except NotFoundError:
                first = {}
            team = _team_of(first) if first.get("type") == "SandboxRequested" else None
            self._remember(self._teams, sandbox_id, team)
        return self._teams[sandbox_id]

    @staticmethod
    def _remember(book: OrderedDict[str, Any], key: str, value: Any) -> None:
        book[key] = value
        book.move_to_end(key)
        while len(book) > _TEAMS_KEPT:
            book.popitem(last=False)


def _team_of(requested: dict[str, Any]) -> str | None:
    payload = requested.get("payload") or {}
    team = (payload.get("spec") or payload).get("team_id")
    return team if isinstance(team, str) else None
