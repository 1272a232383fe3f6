"""W3C trace context across NATS: inject on publish, extract on consume (design rule 10).

Spans follow the OpenTelemetry messaging conventions: a PRODUCER span per publish, a
CONSUMER span per handled message, parented on the producer through the `traceparent`
header. Reads of history (aggregate loads, projections, replays) create no spans: they are
folds over the past, not hops of a request.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind

if TYPE_CHECKING:
    from bus.records import RecordedEvent

__all__ = ["consume_span", "project_spans", "publish_span", "tracer"]

_SYSTEM = "nats"


def tracer() -> trace.Tracer:
    """Looked up per call so that a provider installed after import (tests) is used."""
    return trace.get_tracer("aenv.bus")


def _recording() -> bool:
    """Whether a real tracer provider is installed. Without one, building no-op spans costs
    more than the publish itself (~17 µs), so the hot path skips them."""
    return not isinstance(
        trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider
    )


@contextmanager
def publish_span(subject: str, message_id: str, headers: dict[str, str]) -> Iterator[Span]:
    """A PRODUCER span around one publish; writes its context into `headers`."""
    if not _recording():
        # Still forward a caller's context (e.g. extracted from an incoming request).
        current = trace.get_current_span()
        if current.get_span_context().is_valid:
            propagate.inject(headers)
        yield current
        return
    with tracer().start_as_current_span(
        f"send {subject}",
        kind=SpanKind.PRODUCER,
        attributes={
            "messaging.system": _SYSTEM,
            "messaging.operation.type": "send",
            "messaging.destination.name": subject,
            "messaging.message.id": message_id,
        },
    ) as span:
        propagate.inject(headers)
        yield span


@contextmanager
def consume_span(
    subject: str, message_id: str, headers: Mapping[str, str] | None, consumer: str
) -> Iterator[Span]:
    """A CONSUMER span for handling one message, child of the producer's span if any."""
    parent = propagate.extract(dict(headers or {}))
    token = otel_context.attach(parent)
    try:
        with tracer().start_as_current_span(
            f"process {subject}",
            kind=SpanKind.CONSUMER,
            attributes={
                "messaging.system": _SYSTEM,
                "messaging.operation.type": "process",
                "messaging.destination.name": subject,
                "messaging.consumer.group.name": consumer,
                "messaging.message.id": message_id,
            },
        ) as span:
            yield span
    finally:
        otel_context.detach(token)


@contextmanager
def project_spans(batch: Sequence[RecordedEvent], projection: str) -> Iterator[None]:
    """A CONSUMER span per live event folded into a read model, each parented on the span
    that appended the event: the last hop of a request's trace (API → node → read model).
    Rebuilds and catch-ups do not come through here."""
    if not _recording():
        yield
        return
    with ExitStack() as stack:
        for rec in batch:
            if rec.headers and "traceparent" in rec.headers:
                span = consume_span(
                    rec.subject, str(rec.envelope.event_id), rec.headers, f"projection:{projection}"
                )
                stack.enter_context(span)
        yield
