"""Fixtures of the bus integration tests (real NATS at 127.0.0.1:4222)."""

from tests.integration.bus.fixtures import _tracer_provider, bus, bus_settings, spans

__all__ = ["_tracer_provider", "bus", "bus_settings", "spans"]
