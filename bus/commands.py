"""Publishing commands to AENV_CMD, deduplicated by command id."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from uuid import uuid5

from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import APIError, NoStreamResponseError

from bus import headers as h
from bus.envelope import (
    CommandEnvelope,
    MessageContext,
    decode_command_envelope,
    encode_command,
)
from bus.envelope import commands as command_registry
from bus.errors import DecodeError, PublishError
from bus.publisher import JetStreamPublisher
from bus.settings import BusSettings
from bus.subjects import COMMAND_VERBS, Names
from bus.tracing import publish_span
from domain import Command

__all__ = ["CommandBus", "CommandReceipt", "aggregate_id_of", "decode_command", "verb_of"]


def aggregate_id_of(command: Command) -> str:
    """The id of the aggregate a command addresses (its subject's last token)."""
    try:
        return command.aggregate_id
    except TypeError as e:
        raise DecodeError(str(e)) from None


def verb_of(command: Command) -> str:
    try:
        return COMMAND_VERBS[type(command).__name__]
    except KeyError:
        raise DecodeError(f"{type(command).__name__} is not sent over the bus") from None


def decode_command(data: bytes) -> tuple[CommandEnvelope, Command]:
    """Envelope and command of a message from AENV_CMD (upcast if older)."""
    env = decode_command_envelope(data)
    return env, command_registry.load(env.type, env.schema_version, env.payload)


@dataclass(frozen=True)
class CommandReceipt:
    """Where the command landed; `duplicate` means this command id was already queued."""

    command_id: str
    seq: int
    duplicate: bool


class CommandBus:
    """Sends commands: to the node holding a sandbox, or to placement (any node with room)."""

    def __init__(self, publisher: JetStreamPublisher, settings: BusSettings) -> None:
        self._publisher = publisher
        self._names = Names(settings.bus_prefix)
        self._retry_s = settings.publish_retry_s

    async def to_node(
        self, node_id: str, command: Command, *, context: MessageContext | None = None
    ) -> CommandReceipt:
        return await self.send(
            self._names.node_command(node_id, verb_of(command)), command, context=context
        )

    async def to_each_node(
        self, nodes: Iterable[str], command: Command, *, context: MessageContext | None = None
    ) -> list[CommandReceipt]:
        """The command to every node in `nodes` (e.g. a template delete: each node that holds
        a copy drops it), each copy with a command id of its own derived from the command's
        and the node's — JetStream de-duplicates by message id across the whole stream, so
        one id sent to several nodes' queues would reach only the first. Redelivering the
        same command derives the same ids: still once per node."""
        receipts = []
        for node in sorted(set(nodes)):
            copy = command.model_copy(update={"command_id": uuid5(command.command_id, node)})
            receipts.append(await self.to_node(node, copy, context=context))
        return receipts

    async def to_placement(
        self, command: Command, *, context: MessageContext | None = None
    ) -> CommandReceipt:
        return await self.send(
            self._names.place_command(verb_of(command)), command, context=context
        )

    async def to_builder(
        self, command: Command, *, context: MessageContext | None = None
    ) -> CommandReceipt:
        return await self.send(
            self._names.build_command(verb_of(command)), command, context=context
        )

    async def send(
        self, subject: str, command: Command, *, context: MessageContext | None = None
    ) -> CommandReceipt:
        """Publish with `Nats-Msg-Id` = command id: a command sent twice is queued once."""
        env, data = encode_command(
            command, aggregate_id=aggregate_id_of(command), context=context or MessageContext()
        )
        cid = str(env.command_id)
        hdrs = {
            h.MSG_ID: cid,
            h.EXPECTED_STREAM: self._names.command_stream,
        }
        with publish_span(subject, cid, hdrs):
            try:
                ack, _ = await self._publisher.publish_stored(
                    subject, data, hdrs, budget_s=self._retry_s
                )
            except NoStreamResponseError as e:
                raise PublishError(f"{subject}: no stream stores it") from e
            except (APIError, NatsTimeoutError, TimeoutError) as e:
                raise PublishError(f"{subject}: {e!r}") from e
        return CommandReceipt(command_id=cid, seq=ack.seq, duplicate=bool(ack.duplicate))
