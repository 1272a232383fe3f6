"""Alembic environment, async-aware.

Two ways in:
- `alembic upgrade head` from a shell: builds an async engine from AENV_DATABASE_URL and runs
  the migrations inside `connection.run_sync`;
- `projections.db.migrate(url)` from Python: passes its own (sync-facing) connection in
  `config.attributes["connection"]`, so no second event loop is needed.
"""

from __future__ import annotations

import asyncio
import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import pool
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from projections.tables import metadata

config = context.config
target_metadata = metadata
if config.config_file_name is not None and "connection" not in config.attributes:
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("AENV_DATABASE_URL")
    if not url:
        raise RuntimeError("set AENV_DATABASE_URL (postgresql+asyncpg://…)")
    return url


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # The `nodes` view is not a table to autogenerate.
        include_object=lambda obj, name, type_, reflected, compare_to: (
            not (type_ == "table" and name == "nodes")
        ),
        transaction_per_migration=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_async() -> None:
    engine = create_async_engine(_url(), poolclass=pool.NullPool)
    async with engine.connect() as conn:
        await conn.run_sync(_run)
    await engine.dispose()


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
    else:
        asyncio.run(_run_async())


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
