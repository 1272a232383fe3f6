"""aenv's pipeline client: drive aenv sandboxes from an RL pipeline straight over NATS.

    async with await aenv_pipeline.connect("nats://…:4222", team="default") as p:
        out = await p.create_sandbox("base", metadata={"run": "r1"})
        async for e in p.replay(sandbox=out.sandbox_id): ...

Installable alone (`pip install ./clients/python`: nats-py and pydantic only); the wire
schema it checks commands against is the server's (`aenv schema`), see `wire`.
docs/pipelines.md is the guide.
"""

from aenv_pipeline.audit import Mismatch
from aenv_pipeline.client import CommandFailed, CommandRefused, Outcome, Pipeline, connect
from aenv_pipeline.events import Event, SandboxView, fold
from aenv_pipeline.names import Names
from aenv_pipeline.wire import CommandEnvelope, EventEnvelope, InvalidCommand, schema

__all__ = [
    "CommandEnvelope",
    "CommandFailed",
    "CommandRefused",
    "Event",
    "EventEnvelope",
    "InvalidCommand",
    "Mismatch",
    "Names",
    "Outcome",
    "Pipeline",
    "SandboxView",
    "connect",
    "fold",
    "schema",
]
