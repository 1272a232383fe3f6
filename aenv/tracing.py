"""OpenTelemetry for one aenv process, configured by the standard environment.

- `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, or
  `OTEL_TRACES_EXPORTER=otlp`): spans go to that collector over OTLP/HTTP (protobuf),
  through a batch span processor (`OTEL_BSP_*`) — never on the request's path.
  `OTEL_EXPORTER_OTLP_HEADERS`, `…_TIMEOUT`, `…_COMPRESSION` as the SDK reads them.
- `OTEL_SERVICE_NAME` names the service (default `aenv-api`, `aenv-node`, `aenv` for the
  supervisor); every process also carries `aenv.role`. `OTEL_RESOURCE_ATTRIBUTES` adds
  more (a cluster, a region).
- `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG` (default `parentbased_always_on`);
  `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turns tracing off.
- `AENV_TRACE_FILE=<path>`: spans also go, one JSON object per line, to that file (the
  trace of one request readable without a collector: the e2e tests use it).

With neither an exporter nor a file, no provider is installed and the bus skips span
building entirely (`bus.tracing`), so an untraced stack pays nothing. With one, the HTTP
server (ASGI: `api.app`), httpx clients and SQLAlchemy (`instrument_engine`) are traced by
the official OpenTelemetry instrumentations, beside aenv's own spans at each NATS hop.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

__all__ = ["JsonLinesExporter", "instrument_engine", "otlp_wanted", "setup_tracing"]


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
            lines.append(
                json.dumps(
                    {
                        "trace_id": f"{ctx.trace_id:032x}",
                        "span_id": f"{ctx.span_id:016x}",
                        "parent_id": f"{s.parent.span_id:016x}" if s.parent else None,
                        "name": s.name,
                        "kind": s.kind.name,
                        "start": s.start_time,
                        "end": s.end_time,
                        "attributes": dict(s.attributes or {}),
                        "service": s.resource.attributes.get("service.name"),
                    },
                    default=str,
                )
            )
        with self._lock, open(self._path, "a") as f:
            f.write("".join(line + "\n" for line in lines))
        return SpanExportResult.SUCCESS


def otlp_wanted(env: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Whether the standard environment asks for an OTLP exporter."""
    exporters = [e.strip() for e in env.get("OTEL_TRACES_EXPORTER", "").split(",") if e.strip()]
    if "none" in exporters:
        return False
    if "otlp" in exporters:
        return True
    return bool(
        env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def setup_tracing(service: str) -> bool:
    """Install a tracer provider if the environment asks for one (see above); True if
    tracing is on."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters: list[SpanExporter] = []
    if path := os.environ.get("AENV_TRACE_FILE"):
        exporters.append(JsonLinesExporter(path))
    if otlp_wanted():
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporters.append(OTLPSpanExporter())  # endpoint, headers, timeout: from OTEL_*
    if not exporters:
        return False
    attributes: dict[str, Any] = {"aenv.role": service.removeprefix("aenv-")}
    if not os.environ.get("OTEL_SERVICE_NAME"):
        attributes[SERVICE_NAME] = service
    # the sampler comes from OTEL_TRACES_SAMPLER (the SDK's default: parent-based, on)
    provider = TracerProvider(resource=Resource.create(attributes))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    HTTPXClientInstrumentor().instrument()
    return True


def instrument_engine(engine: Any) -> None:
    """SQL statements as spans (child of whatever span runs them: a request, a projection
    batch), when tracing is on. `engine`: an `AsyncEngine`."""
    if isinstance(trace.get_tracer_provider(), TracerProvider):
        from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor

        # Its declared range ends below SQLAlchemy 2.1, whose engine events (all it hooks)
        # are unchanged: tests/vmless/test_observability.py checks the spans come.
        SQLAlchemyInstrumentor().instrument(engine=engine.sync_engine, skip_dep_check=True)
