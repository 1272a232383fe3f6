"""OpenTelemetry for one aenv process: spans to a JSON-lines file when `AENV_TRACE_FILE` is
set (the trace of one request is then readable without a collector), nothing otherwise.

With no provider installed, the bus skips span building entirely (see bus.tracing), so an
untraced stack pays nothing.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


class JsonLinesExporter(SpanExporter):
    """One JSON object per finished span: ids, parent, name, kind, times, attributes."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = []
        for s in spans:
            ctx = s.get_span_context()
            if ctx is None:
                continue
            lines.append(json.dumps({
                "trace_id": f"{ctx.trace_id:032x}",
                "span_id": f"{ctx.span_id:016x}",
                "parent_id": f"{s.parent.span_id:016x}" if s.parent else None,
                "name": s.name,
                "kind": s.kind.name,
                "start": s.start_time,
                "end": s.end_time,
                "attributes": dict(s.attributes or {}),
                "service": s.resource.attributes.get("service.name"),
            }, default=str))  # fmt: skip
        with self._lock, open(self._path, "a") as f:
            f.write("".join(line + "\n" for line in lines))
        return SpanExportResult.SUCCESS


def setup_tracing(service: str) -> bool:
    """Install a tracer provider if `AENV_TRACE_FILE` asks for one; True if tracing is on."""
    path = os.environ.get("AENV_TRACE_FILE")
    if not path:
        return False
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(path)))
    trace.set_tracer_provider(provider)
    return True
