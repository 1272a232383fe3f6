"""Every API of a fleet migrates the schema at start: several at once on a fresh database
must all succeed, one after the other, without deadlocking on the lock they serialise on
(one blocked in `pg_advisory_lock` held a snapshot the other's `CREATE INDEX CONCURRENTLY`
waited for, and Postgres aborted it)."""

from __future__ import annotations

import asyncio
import secrets

import asyncpg
from alembic.script import ScriptDirectory

from projections import alembic_config, migrate

PG = "postgresql://postgres@127.0.0.1:5432"


async def test_three_processes_migrate_a_fresh_database_at_once() -> None:
    name = f"aenv_test_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(f"{PG}/postgres")
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        url = f"postgresql+asyncpg://postgres@127.0.0.1:5432/{name}"
        await asyncio.wait_for(asyncio.gather(*(migrate(url) for _ in range(3))), 120)
        conn = await asyncpg.connect(f"{PG}/{name}")
        try:
            head = ScriptDirectory.from_config(alembic_config()).get_current_head()
            assert await conn.fetchval("SELECT version_num FROM alembic_version") == head
        finally:
            await conn.close()
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
