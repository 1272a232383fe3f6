"""Session fixtures for tests against the real NATS server: one bus namespace per session.

Each session gets its own prefix (`t<random>`), so its streams never meet another session's
or a running stack's, and deletes them at the end. Imported by the bus and projections
conftests.
"""

from __future__ import annotations

import contextlib
import re
import secrets
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import pytest
import pytest_asyncio
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
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


#: Test namespaces are `t` + 8 hex digits; those older than this are from sessions that were
#: killed before their teardown ran (a session lasts seconds), and are removed.
STALE_AFTER = timedelta(minutes=30)
_TEST_STREAM = re.compile(
    r"(T[0-9A-F]{8}_AENV_(EVT|CMD|FEED|TEAM_.+))|(KV_t[0-9a-f]{8}_aenv_(nodes|routes|secrets|gc_lease|admission))"
)


async def sweep_stale_namespaces(js: JetStreamContext) -> None:
    now = datetime.now(UTC)
    for info in await js.streams_info():
        name = info.config.name or ""
        if _TEST_STREAM.fullmatch(name) and info.created and now - info.created > STALE_AFTER:
            with contextlib.suppress(NotFoundError):
                await js.delete_stream(name)


@pytest_asyncio.fixture(scope="session")
async def bus(bus_settings: BusSettings) -> AsyncIterator[Bus]:
    b = await Bus.connect(bus_settings, name="aenv-tests")
    await sweep_stale_namespaces(b.js)
    try:
        yield b
    finally:
        # the session's last teardown, after the slow tiers: a connection idle that long
        # may be reconnecting, and a namespace left behind is swept by the next session
        # (`sweep_stale_namespaces`), so a timeout here fails no test
        try:
            await delete_all(b.js, bus_settings)
        except NatsTimeoutError as e:
            print(f"test namespace {bus_settings.bus_prefix} left to the sweep: {e!r}")
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
