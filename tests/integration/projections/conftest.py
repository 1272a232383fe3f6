"""Fixtures of the projection tests: a fresh database per session (real Postgres at
127.0.0.1:5432), migrated to head, dropped at the end; plus a bus namespace of their own."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import asyncpg
import pytest
import pytest_asyncio
from sqlalchemy.ext.asyncio import AsyncEngine

from bus import Bus
from projections import Projector, all_projections, create_engine, migrate
from tests.integration.bus.fixtures import _tracer_provider, bus, bus_settings, spans

__all__ = ["_tracer_provider", "bus", "bus_settings", "spans"]

PG = "postgresql://postgres@127.0.0.1:5432"


@pytest.fixture(scope="session")
def db_name() -> str:
    return f"aenv_test_{secrets.token_hex(4)}"


@pytest_asyncio.fixture(scope="session")
async def db_url(db_name: str) -> AsyncIterator[str]:
    admin = await asyncpg.connect(f"{PG}/postgres")
    try:
        await _sweep_stale_databases(admin)
        await admin.execute(f'CREATE DATABASE "{db_name}"')
        url = f"postgresql+asyncpg://postgres@127.0.0.1:5432/{db_name}"
        await migrate(url)
        yield url
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
        await admin.close()


async def _sweep_stale_databases(admin: asyncpg.Connection) -> None:
    """Drop test databases left by sessions killed before teardown (older than 30 min: the
    creation time of a database is its PG_VERSION file's)."""
    stale = await admin.fetch(
        """SELECT datname FROM pg_database
           WHERE datname ~ '^aenv_test_[0-9a-f]{8}$'
             AND (pg_stat_file('base/' || oid || '/PG_VERSION')).modification
                 < now() - interval '30 minutes'"""
    )
    for row in stale:
        await admin.execute(f'DROP DATABASE IF EXISTS "{row[0]}" WITH (FORCE)')


@pytest_asyncio.fixture(scope="session")
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    e = create_engine(db_url, pool_size=5)
    yield e
    await e.dispose()


@pytest_asyncio.fixture(scope="session")
async def projectors(engine: AsyncEngine, bus: Bus) -> AsyncIterator[dict[str, Projector]]:
    """The live read models, following this session's stream in the background."""
    running = {p.name: Projector(engine, bus.js, bus.settings, p) for p in all_projections()}
    for p in running.values():
        await p.start()
    yield running
    for p in running.values():
        await p.stop()
