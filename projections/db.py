"""Database access of the read side: settings, engine, and programmatic migrations."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

from alembic import command
from alembic.config import Config
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

__all__ = ["DbSettings", "alembic_config", "create_engine", "migrate"]

_ROOT = Path(__file__).resolve().parent.parent


class DbSettings(BaseSettings):
    """Where the read models live."""

    model_config = SettingsConfigDict(env_prefix="AENV_", frozen=True, extra="ignore")

    database_url: str = "postgresql+asyncpg://postgres@127.0.0.1:5432/aenv"
    pool_size: int = 10


def create_engine(url: str, *, pool_size: int = 10) -> AsyncEngine:
    """An asyncpg engine. `pool_pre_ping` because Postgres restarts must not poison the pool."""
    return create_async_engine(url, pool_size=pool_size, pool_pre_ping=True)


def alembic_config(url: str | None = None) -> Config:
    """Alembic's config: the source tree's `alembic.ini`, or — an installed wheel, which
    has no such file — one built here around the `migrations` package."""
    ini = _ROOT / "alembic.ini"
    cfg = Config(str(ini)) if ini.is_file() else Config()
    cfg.set_main_option("script_location", str(_migrations_dir()))
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


#: How often a migration waiting for another process's polls the lock.
_LOCK_POLL_S = 0.2
#: Key of the session-level advisory lock migrations hold: every API process of a fleet
#: migrates at start, and two Alembic runs at once would race on `alembic_version`.
_MIGRATION_LOCK = 0x61656E76  # "aenv"


def _migrations_dir() -> Path:
    spec = importlib.util.find_spec("migrations")  # located, not imported (env.py runs it)
    if spec is not None and spec.origin is not None:
        return Path(spec.origin).parent
    return _ROOT / "migrations"


async def _take_lock(conn: AsyncConnection) -> None:
    """The migration lock, polled with no transaction open between tries: a process
    blocked in `pg_advisory_lock` sits in an open transaction, whose snapshot the holder's
    `CREATE INDEX CONCURRENTLY` then waits for — two APIs migrating a fresh database at
    once deadlocked, and Postgres aborted the waiting one."""
    while True:
        got = await conn.scalar(text("SELECT pg_try_advisory_lock(:k)"), {"k": _MIGRATION_LOCK})
        await conn.commit()
        if got:
            return
        await asyncio.sleep(_LOCK_POLL_S)


async def migrate(url: str, revision: str = "head") -> None:
    """`alembic upgrade <revision>` on `url`, from inside a running event loop; one process
    at a time (the others wait, then find nothing left to do)."""
    engine = create_async_engine(url)
    try:
        # A connection with no transaction open: Alembic begins one per migration itself,
        # and steps out of it for CONCURRENTLY index builds (autocommit blocks). The lock
        # is the session's, so it outlives the commit that closes the lock's own statement.
        async with engine.connect() as conn:
            await _take_lock(conn)

            def upgrade(sync_conn: Connection) -> None:
                cfg = alembic_config()
                cfg.attributes["connection"] = sync_conn
                command.upgrade(cfg, revision)

            await conn.run_sync(upgrade)
            await conn.commit()
            await conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _MIGRATION_LOCK})
            await conn.commit()
    finally:
        await engine.dispose()
