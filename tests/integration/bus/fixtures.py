"""Session fixtures for tests against the real NATS server: one bus namespace per session.

Each session gets its own prefix (`t<random>`), so its streams never meet another session's
or a running stack's, and deletes them at the end. Imported by the bus and projections
conftests.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bus import Bus, BusSettings, delete_all

NATS_URL = "nats://127.0.0.1:4222"


@pytest.fixture(scope="session")
def bus_settings() -> BusSettings:
    return BusSettings(
        nats_url=NATS_URL, bus_prefix=f"t{secrets.token_hex(4)}", duplicate_window_s=60
    )


@pytest_asyncio.fixture(scope="session")
async def bus(bus_settings: BusSettings) -> AsyncIterator[Bus]:
    b = await Bus.connect(bus_settings, name="aenv-tests")
    try:
        yield b
    finally:
        await delete_all(b.js, bus_settings)
        await b.close()


_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="session")
def _tracer_provider() -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    trace.set_tracer_provider(provider)  # once per process; later calls are ignored
    return provider


@pytest.fixture
def spans(_tracer_provider: TracerProvider) -> Iterator[InMemorySpanExporter]:
    """The spans finished during one test."""
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()
