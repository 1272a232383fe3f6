"""Trace context crosses NATS: one request's spans form one tree (rule 10)."""

from __future__ import annotations

from datetime import UTC, datetime

from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from bus import Bus, Delivery
from domain import sandbox as sb
from domain.sandbox.values import new_sandbox_id
from tests.integration.bus.helpers import consumer
from tests.support import eventually

T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def test_create_span_tree(bus: Bus, spans: InMemorySpanExporter) -> None:
    """API span → PRODUCER (command) → CONSUMER (node) → PRODUCER (event), one trace."""

    async def node_handler(d: Delivery) -> None:
        state, version = await bus.sandboxes.load(d.envelope.aggregate_id)
        assert isinstance(d.command, sb.CreateSandbox)
        await bus.sandboxes.append(
            d.envelope.aggregate_id, version, sb.decide(state, d.command), context=d.context
        )

    sid = new_sandbox_id()
    async with consumer(bus, node_handler) as (rec, node):
        with trace.get_tracer("test").start_as_current_span("POST /v2/sandboxes"):
            await bus.commands.to_node(
                node, sb.CreateSandbox(sandbox_id=sid, template_id="base", at=T0)
            )
        await eventually(lambda: _done(rec.done))
        await eventually(lambda: _count(spans, 4))

    finished = {s.name: s for s in spans.get_finished_spans()}
    root = finished["POST /v2/sandboxes"]
    send_cmd = finished[f"send {bus.names.node_command(node, 'create')}"]
    process = finished[f"process {bus.names.node_command(node, 'create')}"]
    send_evt = finished[f"send {bus.names.sandbox_events(sid)}"]
    assert {s.context.trace_id for s in finished.values()} == {root.context.trace_id}
    assert send_cmd.kind is SpanKind.PRODUCER and send_cmd.parent is not None
    assert send_cmd.parent.span_id == root.context.span_id
    assert process.kind is SpanKind.CONSUMER and process.parent is not None
    assert process.parent.span_id == send_cmd.context.span_id
    assert send_evt.kind is SpanKind.PRODUCER and send_evt.parent is not None
    assert send_evt.parent.span_id == process.context.span_id
    assert len(finished) == 4  # the aggregate load inside the handler made no span

    # reading history back is not a hop: no spans at all
    spans.clear()
    await bus.sandboxes.load(sid)
    await bus.sandboxes.read(sid)
    assert spans.get_finished_spans() == ()


async def _done(done: list[str]) -> bool:
    return len(done) == 1


async def _count(spans: InMemorySpanExporter, n: int) -> bool:
    return len(spans.get_finished_spans()) >= n
