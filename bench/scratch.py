"""A bus namespace and a database of its own for a bench run on the machine's NATS and
Postgres: a run never meets another's streams or tables, and leaves neither behind."""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import asyncpg

from bus import Bus, BusSettings, delete_all

NATS_URL = os.environ.get("AENV_NATS_URL", "nats://127.0.0.1:4222")
PG = os.environ.get("AENV_BENCH_PG", "postgresql://postgres@127.0.0.1:5432")


@dataclass(frozen=True)
class Scratch:
    bus: Bus
    settings: BusSettings
    #: the run's database, as SQLAlchemy's asyncpg URL (`projections.create_engine`)
    url: str


@asynccontextmanager
async def scratch(name: str = "aenv-bench") -> AsyncIterator[Scratch]:
    settings = BusSettings(nats_url=NATS_URL, bus_prefix=f"b{secrets.token_hex(4)}")
    db = f"aenv_bench_{secrets.token_hex(4)}"
    await create_database(db)
    try:
        bus = await Bus.connect(settings, name=name)
        try:
            yield Scratch(bus, settings, f"postgresql+asyncpg://{PG.split('://', 1)[1]}/{db}")
        finally:
            await delete_all(bus.js, settings)
            await bus.close()
    finally:
        await drop_database(db)


async def create_database(db: str) -> None:
    """A database of the run's own on the machine's Postgres (`PG`)."""
    await _admin(f'CREATE DATABASE "{db}"')


async def drop_database(db: str) -> None:
    """The run's database gone, whoever is still connected to it."""
    await _admin(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


async def delete_namespace(prefix: str) -> None:
    """Every stream, consumer and bucket of the bus namespace `prefix` gone (a stack the run
    started made them; nothing of this process holds them)."""
    settings = BusSettings(nats_url=NATS_URL, bus_prefix=prefix)
    bus = await Bus.connect(settings, setup=False)
    try:
        await delete_all(bus.js, settings)
    finally:
        await bus.close()


async def _admin(statement: str) -> None:
    admin = await asyncpg.connect(f"{PG}/postgres")
    try:
        await admin.execute(statement)
    finally:
        await admin.close()
