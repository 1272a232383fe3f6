"""The pipelines' ingress: commands a team's pipeline sends over NATS, checked as the HTTP
API checks them and forwarded to the command stream (issue 32, docs/pipelines.md).

A pipeline user may publish only to `aenv.in.<its team>.<verb>` (NATS permissions,
`aenv keys pipeline create`), so the team is taken from the subject, never from the
command: a create whose `team_id` names another team is refused, a command on another
team's sandbox too, and each refusal is recorded as a `CommandRejected` (code
`forbidden`) on the sandbox's log, with the pipeline as its actor. A create passes the
team's admission limits (429 with a retry time, as over HTTP) and its lease check; then it
goes to placement, and a pause, kill or timeout to the node that holds the sandbox, with
the pipeline's command id as `Nats-Msg-Id` (a retried request is queued once).

Core request/reply, served by every API process in one queue group: the answer is
`{"ok": true, "seq", "duplicate"}` once the command is queued, or `{"ok": false, "code",
"message", "retry_after_s"}` — the command's outcome comes from the log as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any, Final

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from api.admission import admitted
from api.auth import Caller
from api.context import ApiContext
from api.errors import ApiError
from api.leases import check_create as check_lease
from bus.commands import decode_command
from bus.consumer import record_rejection
from bus.envelope import MessageContext
from bus.errors import BusError, DecodeError
from bus.subjects import COMMAND_VERBS
from domain import DomainError
from domain import sandbox as sb

__all__ = ["ALLOWED", "Ingress"]

log = logging.getLogger(__name__)

#: What a pipeline may send, by subject verb: creates, and pause/kill/timeout of its own.
ALLOWED: Final = frozenset({"create", "pause", "kill", "timeout"})
QUEUE: Final = "aenv-ingress"


class Refused(Exception):
    def __init__(self, code: str, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.retry_after_s = code, message, retry_after_s


class Ingress:
    """Subscribes to every team's ingress subject (in a queue group) and answers each."""

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self.names = ctx.bus.names
        self._sub: Subscription | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._sub = await self.ctx.bus.nc.subscribe(
            self.names.all_ingress, queue=QUEUE, cb=self._on_msg
        )

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        for task in list(self._tasks):
            with contextlib.suppress(Exception):
                await task

    async def _on_msg(self, msg: Msg) -> None:
        task = asyncio.create_task(self._answer(msg))  # the callback must not block others
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, msg: Msg) -> None:
        try:
            body: dict[str, Any] = {"ok": True, **await self.handle(msg.subject, msg.data)}
        except Refused as e:
            body = {"ok": False, "code": e.code, "message": e.message}
            if e.retry_after_s is not None:
                body["retry_after_s"] = e.retry_after_s
        except Exception as e:  # answer anyway: the pipeline must not wait for a timeout
            log.exception("ingress: %s failed", msg.subject)
            body = {"ok": False, "code": "internal", "message": f"{type(e).__name__}: {e}"}
        if msg.reply:
            with contextlib.suppress(Exception):
                await msg.respond(json.dumps(body).encode())

    async def handle(self, subject: str, data: bytes) -> dict[str, Any]:
        """Check and forward one command; what was queued (else `Refused`)."""
        team, verb = self._team_and_verb(subject)
        try:
            env, command = decode_command(data)
        except (DecodeError, ValueError) as e:
            raise Refused("invalid", f"not a command: {e}") from None
        if not isinstance(command, sb.SandboxCommand) or COMMAND_VERBS.get(env.type) != verb:
            raise Refused("invalid", f"{env.type} is not a pipeline's {verb!r} command")
        actor = f"pipeline:{team}"
        context = MessageContext(
            correlation_id=env.correlation_id or env.command_id,
            causation_id=env.command_id,
            actor=actor,
        )
        caller = Caller(key_id=actor, team_id=team)
        if isinstance(command, sb.CreateSandbox):
            if command.team_id not in (None, team):
                await self._record(
                    env.type,
                    command,
                    f"team {command.team_id!r} is not the sender's ({team!r})",
                    context,
                )
                raise Refused("forbidden", f"this pipeline sends for team {team!r} only")
            if command.forked_from is not None or command.volume_mounts:
                raise Refused("invalid", "a pipeline's create names no fork parent nor volumes")
            command = command.model_copy(update={"team_id": team})
            try:
                await check_lease(self.ctx, caller, command.metadata)
                async with admitted(self.ctx, caller, [command.sandbox_id]):
                    receipt = await self.ctx.bus.commands.to_placement(command, context=context)
            except ApiError as e:
                retry = e.headers.get("Retry-After")
                code = "rate_limited" if e.status == 429 else "invalid"
                raise Refused(code, e.message, int(retry) if retry else None) from None
        else:
            sid = command.aggregate_id
            state, _ = await self.ctx.bus.sandboxes.load(sid)
            if state is None or state.team_id != team:
                if state is not None:  # another team's: recorded where that team will see it
                    await self._record(
                        env.type,
                        command,
                        f"sandbox of another team (sender {team!r})",
                        context,
                    )
                raise Refused("not_found", f"team {team} has no sandbox {sid}")
            if state.node_id is None:
                raise Refused("conflict", f"sandbox {sid} is not on a node yet ({state.status})")
            receipt = await self.ctx.bus.commands.to_node(state.node_id, command, context=context)
        return {"seq": receipt.seq, "duplicate": receipt.duplicate}

    def _team_and_verb(self, subject: str) -> tuple[str, str]:
        parsed = self.names.parse_ingress(subject)
        if parsed is None or parsed[1] not in ALLOWED:
            raise Refused("invalid", f"{subject}: pipelines may send {sorted(ALLOWED)} only")
        return parsed

    async def _record(
        self, command_type: str, command: Any, reason: str, context: MessageContext
    ) -> None:
        log.warning("ingress refused %s %s: %s", command_type, command.command_id, reason)
        with contextlib.suppress(BusError, DomainError):
            await record_rejection(
                self.ctx.bus.sandboxes,
                command.aggregate_id,
                command.command_id,
                command_type,
                "forbidden",
                reason,
                context=context,
            )
