"""The embedded servers let in only the stack: NATS wants its user and password, Postgres
a password on every login, and the stack's own login is no superuser. Any local user can
reach 127.0.0.1; the bus and the read models hold every sandbox's envd token."""

from __future__ import annotations

import asyncio
import os
import pwd
import stat
import subprocess
from pathlib import Path

import asyncpg
import nats
import pytest
from nats.errors import Error as NatsError

from aenv.stack import EmbeddedNats, EmbeddedPostgres, ManagedProcess
from aenv.stack.process import free_port
from aenv.stack.services import PG_USER, _postgres_bin

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs Postgres as its own user")


async def test_embedded_nats_refuses_a_client_without_its_credentials(tmp_path: Path) -> None:
    svc = EmbeddedNats(tmp_path)
    url = await svc.start()
    try:
        with pytest.raises((NatsError, OSError)):
            await nats.connect(
                f"nats://127.0.0.1:{svc.port}",
                allow_reconnect=False,
                max_reconnect_attempts=0,
                connect_timeout=3,
            )
        nc = await nats.connect(url, allow_reconnect=False)  # what stack.json says
        assert (await nc.jetstream().account_info()).limits is not None
        await nc.close()
        # `ps` shows every command line to every user: the password must not be on it
        assert svc.process.proc is not None
        argv = Path(f"/proc/{svc.process.proc.pid}/cmdline").read_bytes()
        assert svc.password and svc.password.encode() not in argv
        for secret in (svc.config, svc.dir / "credentials.json"):
            assert stat.S_IMODE(secret.stat().st_mode) == 0o600, secret
    finally:
        await svc.stop()
    again = EmbeddedNats(tmp_path)  # a restart keeps the password the clients have
    assert await again.start() == url.replace(str(svc.port), str(again.port))
    await again.stop()


async def _refused(dsn: str) -> bool:
    try:
        conn = await asyncpg.connect(dsn, timeout=5)
    except (asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError):
        return True
    await conn.close()
    return False


async def _rights(url: str) -> tuple[bool, bool, bool]:
    conn = await asyncpg.connect(url)
    try:
        row = await conn.fetchrow(
            "SELECT rolsuper, rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = current_user"
        )
        assert row is not None
        return row["rolsuper"], row["rolcreaterole"], row["rolcreatedb"]
    finally:
        await conn.close()


async def test_embedded_postgres_wants_passwords_and_the_stack_is_no_superuser(
    tmp_path: Path,
) -> None:
    svc = EmbeddedPostgres(tmp_path)
    url = await svc.start("aenv")
    try:
        assert await _refused(f"postgresql://postgres@127.0.0.1:{svc.port}/postgres")
        assert await _refused(f"postgresql://aenv@127.0.0.1:{svc.port}/aenv")
        assert await _refused(f"postgresql://aenv:wrong@127.0.0.1:{svc.port}/aenv")
        assert await _rights(url) == (False, False, False)
        conn = await asyncpg.connect(url)
        try:  # what the migrations and the projections' rebuild (a scratch schema) do
            await conn.execute("CREATE TABLE t (id serial PRIMARY KEY)")
            await conn.execute("CREATE SCHEMA scratch; DROP SCHEMA scratch")
        finally:
            await conn.close()
        assert stat.S_IMODE(svc.dir.stat().st_mode) == 0o700  # the unix socket's dir
        assert stat.S_IMODE((svc.dir / "credentials.json").stat().st_mode) == 0o600
    finally:
        await svc.stop()
    again = EmbeddedPostgres(tmp_path)  # a restart: same passwords, still hardened
    url2 = await again.start("aenv")
    try:
        assert await _rights(url2) == (False, False, False)
        assert await _refused(f"postgresql://postgres@127.0.0.1:{again.port}/postgres")
    finally:
        await again.stop()


async def _trust_initialised(pgdata: Path) -> None:
    """A data dir as aenv before passwords made it: initdb with trust, the `aenv`
    database and its objects made (and owned) by the superuser."""
    bin_ = _postgres_bin()
    server_user = pwd.getpwnam(PG_USER)
    pgdata.parent.mkdir(parents=True)
    os.chown(pgdata.parent, server_user.pw_uid, server_user.pw_gid)
    for p in pgdata.parent.parents:
        if p == Path("/"):
            break
        os.chmod(p, os.stat(p).st_mode | 0o011)
    subprocess.run(
        [
            str(bin_ / "initdb"),
            "-D",
            str(pgdata),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-instructions",
        ],
        check=True,
        capture_output=True,
        user=PG_USER,
    )
    port = free_port()
    server = ManagedProcess(
        "postgres",
        [
            str(bin_ / "postgres"),
            "-D",
            str(pgdata),
            "-p",
            str(port),
            "-c",
            "listen_addresses=127.0.0.1",
            "-k",
            str(pgdata.parent),
        ],
        pgdata.parent / "old.log",
        user=PG_USER,
    )
    server.start()
    try:
        for _ in range(100):
            try:
                conn = await asyncpg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres")
                break
            except (OSError, asyncpg.PostgresError):
                await asyncio.sleep(0.1)
        else:
            pytest.fail(f"the trust-initialised server did not start: {server.tail()}")
        await conn.execute('CREATE DATABASE "aenv"')
        await conn.close()
        conn = await asyncpg.connect(f"postgresql://postgres@127.0.0.1:{port}/aenv")
        await conn.execute("""
            CREATE TYPE mood AS ENUM ('ok', 'bad');
            CREATE TABLE sandboxes (id serial PRIMARY KEY, token text, m mood);
            INSERT INTO sandboxes (token) VALUES ('envd-secret');
            CREATE SEQUENCE loose_seq;
            CREATE VIEW tokens AS SELECT token FROM sandboxes;
            CREATE MATERIALIZED VIEW counted AS SELECT count(*) FROM sandboxes;
            CREATE SCHEMA side; CREATE TABLE side.t (id bigint GENERATED ALWAYS AS IDENTITY);
            CREATE FUNCTION one() RETURNS int LANGUAGE sql AS 'SELECT 1';
        """)
        await conn.close()
    finally:
        await server.stop()


async def test_a_trust_initialised_data_dir_is_upgraded_in_place(tmp_path: Path) -> None:
    await _trust_initialised(tmp_path / "postgres" / "data")
    svc = EmbeddedPostgres(tmp_path)
    url = await svc.start("aenv")
    try:
        assert await _refused(f"postgresql://postgres@127.0.0.1:{svc.port}/aenv")
        assert await _rights(url) == (False, False, False)
        conn = await asyncpg.connect(url)
        try:
            assert await conn.fetchval("SELECT token FROM tokens") == "envd-secret"
            owners = await conn.fetch("""
                SELECT c.relname, pg_get_userbyid(c.relowner) AS owner FROM pg_class c
                JOIN pg_namespace n ON n.oid = c.relnamespace
                WHERE n.nspname IN ('public', 'side') AND c.relkind IN ('r','S','v','m')
                UNION ALL SELECT nspname, pg_get_userbyid(nspowner) FROM pg_namespace
                WHERE nspname = 'side'
                UNION ALL SELECT typname, pg_get_userbyid(typowner) FROM pg_type
                WHERE typname = 'mood'
                UNION ALL SELECT proname, pg_get_userbyid(proowner) FROM pg_proc
                WHERE proname = 'one'
                UNION ALL SELECT datname, pg_get_userbyid(datdba) FROM pg_database
                WHERE datname = 'aenv'
            """)
            assert {r["relname"] for r in owners} >= {
                "sandboxes",
                "sandboxes_id_seq",
                "loose_seq",
                "tokens",
                "counted",
                "t",
                "t_id_seq",
                "side",
                "mood",
                "one",
                "aenv",
            }
            assert {r["relname"]: r["owner"] for r in owners if r["owner"] != "aenv"} == {}
            # what an owner may do, and a migration does
            await conn.execute("ALTER TABLE sandboxes ADD COLUMN extra int")
            await conn.execute("INSERT INTO sandboxes (token) VALUES ('x')")
            await conn.execute("REFRESH MATERIALIZED VIEW counted")
            await conn.execute("ALTER TYPE mood ADD VALUE 'meh'")
        finally:
            await conn.close()
    finally:
        await svc.stop()
