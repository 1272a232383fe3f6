"""Which exporter the standard OpenTelemetry environment asks for (issue 20)."""

from __future__ import annotations

from aenv.tracing import otlp_wanted


def test_an_endpoint_or_the_otlp_exporter_turns_otlp_on() -> None:
    assert not otlp_wanted({})
    assert otlp_wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert otlp_wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"})
    assert otlp_wanted({"OTEL_TRACES_EXPORTER": "otlp"})  # the SDK's default endpoint
    assert otlp_wanted({"OTEL_TRACES_EXPORTER": "console, otlp"})


def test_none_wins() -> None:
    assert not otlp_wanted(
        {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    )
    assert not otlp_wanted({"OTEL_TRACES_EXPORTER": "console"})
