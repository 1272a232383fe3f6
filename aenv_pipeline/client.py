"""`Pipeline`: publish sandbox commands straight to NATS, await their outcomes, follow and
replay the event log, audit one sandbox against the read model.

What the API does over HTTP, without it: a command is published to the command stream with
`Nats-Msg-Id` = its id (a retried publish runs once), and its answer is read from the log —
the first *stored* event caused by it (`causation_id` = the command id), as the API's own
waits do (`bus/answers.py`): an ordered consumer over every sandbox event from before the
publish on, never a plain subscription (that would also deliver appends the stream refused).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from aenv_pipeline.audit import Mismatch, compare
from aenv_pipeline.events import Event, SandboxView, fold
from aenv_pipeline.names import VERBS, Names
from aenv_pipeline.outcomes import (
    ANSWERS,
    FAILURES,
    CommandFailed,
    CommandRefused,
    Outcome,
    event_of,
)
from aenv_pipeline.wire import CommandEnvelope, EventEnvelope, command_envelope

__all__ = ["CommandFailed", "CommandRefused", "Outcome", "Pipeline", "connect"]

#: Idle heartbeat of the ordered consumers (the server's `bus.feed.ORDERED_HEARTBEAT_S`):
#: the client recreates one that missed two, so a reconnect costs seconds, not tens.
HEARTBEAT_S = 1.0
#: How long a scoped pipeline waits for the ingress to queue a command (not for its outcome).
INGRESS_TIMEOUT_S = 10.0


class Pipeline:
    """One team's pipeline on one aenv stack's NATS. Build it with `connect`.

    `scoped` (a login from `aenv keys pipeline create`): commands go through the stack's
    ingress for the team, events are read from the team's own stream (secrets stripped);
    with `team` None it is an auditor's, which reads every team's and sends nothing.
    Unscoped (the stack's own NATS user): commands go to the command stream and events
    are read from the log itself, the team being a filter this client applies."""

    def __init__(
        self,
        nc: NATS,
        *,
        team: str | None,
        prefix: str = "",
        actor: str | None = None,
        scoped: bool = False,
    ):
        if team is None and not scoped:
            raise ValueError("a pipeline without a team is an auditor's: scoped=True")
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.names = Names(prefix)
        self.team = team
        self.scoped = scoped
        self.actor = actor or f"pipeline:{team}"
        if scoped:
            self._stream = self.names.team_stream(team) if team else self.names.feed_stream
        else:
            self._stream = self.names.event_stream
        self._waiting: dict[str, tuple[tuple[str, ...], asyncio.Future[Event]]] = {}
        self._by_sandbox: dict[str, set[str]] = {}
        self._sub: JetStreamContext.PushSubscription | None = None
        self._seen = 0
        self._lock = asyncio.Lock()
        #: sandbox id → (team, metadata), from its `SandboxRequested` (never changes)
        self._owners: dict[str, tuple[str | None, dict[str, str]]] = {}

    async def close(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None
        for _, future in self._waiting.values():
            future.cancel()
        if not self.nc.is_closed:
            await self.nc.drain()

    async def __aenter__(self) -> Pipeline:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    # -- commands --------------------------------------------------------------------------
    async def create_sandbox(
        self,
        template: str,
        *,
        sandbox_id: str | None = None,
        timeout_s: int = 300,
        cpu_count: int | None = None,
        memory_mb: int | None = None,
        metadata: Mapping[str, str] | None = None,
        env_vars: Mapping[str, str] | None = None,
        command_id: UUID | None = None,
        wait: float | None = 120.0,
    ) -> Outcome:
        """Create a sandbox of `template` (a template id) for this pipeline's team, taken by
        whichever node has room; its outcome, awaited up to `wait` seconds (None: as long as
        it takes) — `CommandFailed` for a failure or a refusal, `TimeoutError` past `wait`
        (the create goes on). Unlike the API's create it has no placement deadline: it
        waits for room. A `command_id` of your own makes a retry idempotent: the same
        command id published again is stored once, and answered from the log."""
        team = self._sender()
        sid = sandbox_id or uuid4().hex[:20]
        fields: dict[str, Any] = {
            "template_id": template,
            "team_id": team,
            "timeout_s": timeout_s,
            "cpu_count": cpu_count,
            "memory_mb": memory_mb,
            "metadata": dict(metadata or {}),
            "env_vars": dict(env_vars or {}),
        }
        env = command_envelope(
            "CreateSandbox", sid, fields, command_id=command_id, actor=self.actor
        )
        return await self._send(self.names.place_command(VERBS["CreateSandbox"]), env, wait)

    async def kill(self, sandbox_id: str, *, wait: float | None = 60.0) -> Outcome | None:
        """Kill one of the team's sandboxes (sent to the node holding it); None if it was
        already killed."""
        view = await self._own(sandbox_id)
        if view.status == "killed":
            return None
        return await self._to_node(view, "KillSandbox", {}, wait)

    async def pause(
        self, sandbox_id: str, *, keep_memory: bool = True, wait: float | None = 60.0
    ) -> Outcome | None:
        """Pause one of the team's running sandboxes; None if it is paused or pausing."""
        view = await self._own(sandbox_id)
        if view.status in ("paused", "pausing"):
            return None
        return await self._to_node(view, "PauseSandbox", {"keep_memory": keep_memory}, wait)

    def _sender(self) -> str:
        if self.team is None:
            raise PermissionError("an auditor sends no commands")
        return self.team

    def _subject(self, sandbox_id: str | None) -> str:
        """One sandbox's events (None: every sandbox's) in the stream this client reads."""
        if self.scoped:
            return self.names.feed(self.team, sandbox_id)
        if sandbox_id is None:
            return self.names.sandbox_events_all
        return self.names.sandbox_events(sandbox_id)

    def _mine(self, team: str | None) -> bool:
        """Whether a sandbox of `team` is this client's to see (a scoped stream holds
        nothing else)."""
        return self.scoped or team == self.team

    async def _to_node(
        self, view: SandboxView, command: str, fields: dict[str, Any], wait: float | None
    ) -> Outcome | None:
        if self.scoped:  # the ingress finds the node
            env = command_envelope(command, view.sandbox_id, fields, actor=self.actor)
            return await self._send("", env, wait)
        if view.node_id is None:  # requested, not yet taken by a node: nothing to address
            raise LookupError(f"sandbox {view.sandbox_id} is not on a node yet ({view.status})")
        env = command_envelope(command, view.sandbox_id, fields, actor=self.actor)
        subject = self.names.node_command(view.node_id, VERBS[command])
        return await self._send(subject, env, wait)

    async def _own(self, sandbox_id: str) -> SandboxView:
        self._sender()
        view = fold(await self.history(sandbox_id))
        if view is None or not self._mine(view.team_id):
            raise LookupError(f"team {self.team} has no sandbox {sandbox_id}")
        return view

    async def _send(self, subject: str, env: CommandEnvelope, wait: float | None) -> Outcome:
        key = str(env.command_id)
        await self._follow_answers()
        answer: asyncio.Future[Event] = asyncio.get_running_loop().create_future()
        wanted = (*ANSWERS[env.type], *FAILURES)
        self._waiting[key] = (wanted, answer)
        self._by_sandbox.setdefault(env.aggregate_id, set()).add(key)
        try:
            if self.scoped:
                duplicate = await self._through_ingress(env)
            else:
                ack = await self.js.publish(
                    subject,
                    env.model_dump_json().encode(),
                    headers={
                        "Nats-Msg-Id": key,
                        "Nats-Expected-Stream": self.names.command_stream,
                    },
                )
                duplicate = bool(ack.duplicate)
            if duplicate:  # sent before (a retry): its answer may be in the log already
                for e in await self.history(env.aggregate_id):
                    if str(e.envelope.causation_id) == key and e.type in wanted:
                        if not answer.done():
                            answer.set_result(e)
                        break
            event = await asyncio.wait_for(answer, wait)
        finally:
            self._waiting.pop(key, None)
            keys = self._by_sandbox.get(env.aggregate_id, set())
            keys.discard(key)
            if not keys:
                self._by_sandbox.pop(env.aggregate_id, None)
        outcome = Outcome(env.command_id, env.aggregate_id, event)
        if not outcome.ok:
            raise CommandFailed(outcome)
        return outcome

    async def _through_ingress(self, env: CommandEnvelope) -> bool:
        """Send a command to the team's ingress; whether it was queued before (a retry)."""
        reply = await self.nc.request(
            self.names.ingress(self._sender(), VERBS[env.type]),
            env.model_dump_json().encode(),
            timeout=INGRESS_TIMEOUT_S,
            headers={"Nats-Msg-Id": str(env.command_id)},
        )
        body = json.loads(reply.data or b"{}")
        if not body.get("ok"):
            raise CommandRefused(
                str(body.get("code")), str(body.get("message")), body.get("retry_after_s")
            )
        return bool(body.get("duplicate"))

    async def _follow_answers(self) -> None:
        async with self._lock:
            if self._sub is not None:
                return
            info = await self.js.stream_info(self._stream)
            self._seen = info.state.last_seq
            self._sub = await self.js.subscribe(
                self._subject(None),
                stream=self._stream,
                cb=self._on_answer,
                ordered_consumer=True,
                idle_heartbeat=HEARTBEAT_S,
                config=ConsumerConfig(
                    deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self._seen + 1
                ),
            )

    async def _on_answer(self, msg: Msg) -> None:
        if msg.metadata.sequence.stream <= self._seen:
            return  # a recreated consumer's redelivery
        self._seen = msg.metadata.sequence.stream
        try:
            e = event_of(msg)
        except ValueError:
            return
        cause = str(e.envelope.causation_id) if e.envelope.causation_id else None
        waiter = self._waiting.get(cause) if cause else None
        if waiter is not None and e.type in waiter[0] and not waiter[1].done():
            waiter[1].set_result(e)
        if e.type == "SandboxKilled":  # a kill overtook the command: that is its end
            for key in self._by_sandbox.get(e.sandbox_id, set()):
                pending = self._waiting.get(key)
                if pending is not None and not pending[1].done():
                    pending[1].set_result(e)

    # -- reading the log -------------------------------------------------------------------
    async def history(self, sandbox_id: str) -> list[Event]:
        """Every event of one sandbox, in order (another team's reads as empty)."""
        events = [e async for e in self._read(self._subject(sandbox_id), None)]
        if events and events[0].type == "SandboxRequested":
            self._remember(events[0])
        owner = await self._owner(sandbox_id) if events else None
        return events if owner is not None and self._mine(owner[0]) else []

    async def replay(
        self,
        *,
        sandbox: str | None = None,
        since: int | datetime | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> AsyncGenerator[Event, None]:
        """The team's sandbox events stored so far, from `since` (a stream sequence or a
        time; None: the beginning), in log order: one sandbox's, or those of sandboxes
        whose metadata holds every pair of `metadata` (a lease's, a run's), or all."""
        async for e in self._read(self._subject(sandbox), since):
            if await self._matches(e, metadata):
                yield e

    async def follow(
        self,
        *,
        sandbox: str | None = None,
        since: int | datetime | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> AsyncGenerator[Event, None]:
        """Like `replay`, but live: from `since` (None: from now) and never ending."""
        async for e in self._read(self._subject(sandbox), since, live=True):
            if await self._matches(e, metadata):
                yield e

    async def verify(self, sandbox_id: str, read_model: Mapping[str, Any]) -> list[Mismatch]:
        """Fold one sandbox's history and compare it with what the API answers for it
        (`GET /sandboxes/{id}`'s JSON, None/empty for a 404): the mismatches, none when the
        read model says what the log says."""
        return compare(fold(await self.history(sandbox_id)), read_model)

    async def _matches(self, e: Event, metadata: Mapping[str, str] | None) -> bool:
        if e.type == "SandboxRequested":
            self._remember(e)
        owner = await self._owner(e.sandbox_id)
        if owner is None or not self._mine(owner[0]):
            return False
        return all(owner[1].get(k) == v for k, v in (metadata or {}).items())

    def _remember(self, e: Event) -> None:
        spec = e.payload.get("spec", e.payload)
        self._owners[e.sandbox_id] = (spec.get("team_id"), dict(spec.get("metadata") or {}))

    async def _owner(self, sandbox_id: str) -> tuple[str | None, dict[str, str]] | None:
        """The team and metadata a sandbox was created with: from its first event."""
        if sandbox_id not in self._owners:
            try:
                raw = await self.js.get_msg(
                    self._stream, seq=1, subject=self._subject(sandbox_id), next=True
                )
            except NotFoundError:
                return None
            env = EventEnvelope.model_validate_json(raw.data or b"{}")
            if env.type != "SandboxRequested":
                return None
            self._remember(Event(raw.seq or 0, raw.subject or "", env))
        return self._owners[sandbox_id]

    async def _read(
        self, subject: str, since: int | datetime | None, *, live: bool = False
    ) -> AsyncGenerator[Event, None]:
        """An ordered consumer over `subject`: to the end of what is stored when it starts
        (what is appended meanwhile is left to a `follow`: a replay of a busy log ends), or
        (`live`) on and on."""
        config = _start(since, live)
        end = 0 if live else (await self.js.stream_info(self._stream)).state.last_seq
        queue: asyncio.Queue[Msg] = asyncio.Queue(maxsize=1000)
        sub = await self.js.subscribe(
            subject,
            stream=self._stream,
            ordered_consumer=True,
            idle_heartbeat=HEARTBEAT_S,
            config=config,
            cb=queue.put,
        )
        try:
            if not live:
                info = await sub.consumer_info()
                if info.num_pending == 0 and (
                    info.delivered is None or not info.delivered.consumer_seq
                ):
                    return
            while True:
                msg = await queue.get()
                seq = msg.metadata.sequence.stream
                if not live and seq > end:  # appended after the replay began
                    return
                yield event_of(msg)
                if not live and (msg.metadata.num_pending == 0 or seq >= end):
                    return
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


def _start(since: int | datetime | None, live: bool) -> ConsumerConfig:
    if isinstance(since, datetime):
        return ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=since)
    if isinstance(since, int) and since > 0:
        return ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=since)
    return ConsumerConfig(deliver_policy=DeliverPolicy.NEW if live else DeliverPolicy.ALL)


async def connect(
    servers: str | Sequence[str],
    *,
    team: str | None,
    prefix: str = "",
    scoped: bool = False,
    user: str | None = None,
    password: str | None = None,
    token: str | None = None,
    creds: str | None = None,
    actor: str | None = None,
    **options: Any,
) -> Pipeline:
    """A pipeline for `team` on the stack whose NATS is `servers` (`AENV_NATS_URL`; a list
    or comma-separated for a cluster) and whose bus prefix is `prefix` (`AENV_BUS_PREFIX`).
    `user`/`password`, `token` or a `creds` file log in; other nats-py options pass on.
    `scoped`: the login is a pipeline user's or an auditor's (`aenv keys pipeline create`;
    an auditor's has `team` None): commands through the ingress, events from the team's
    stream; replies come to the login's own inbox prefix, the only one it may read."""
    urls = servers.split(",") if isinstance(servers, str) else list(servers)
    login: dict[str, Any] = {
        k: v
        for k, v in {
            "user": user,
            "password": password,
            "token": token,
            "user_credentials": creds,
        }.items()
        if v is not None
    }
    if scoped:
        options.setdefault("inbox_prefix", Names(prefix).inbox(team))
    name = f"aenv-pipeline-{team}" if team else "aenv-auditor"
    nc = await nats.connect(urls, name=name, **login, **options)
    return Pipeline(nc, team=team, prefix=prefix, actor=actor, scoped=scoped)
