"""The event log's backup and restore procedure, performed (issue 30): events written
through the real decision path (load, decide, append; no VMs), `aenv log backup`, `aenv
log restore` into a fresh nats-server of the test's own, the projections folded from the
restored log into a second database — every read-model table identical, row by row, to
the live one; and the restored log takes the next append of a sandbox (its sequences are
the original's, which the aggregates' versions are)."""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio
from sqlalchemy.ext.asyncio import AsyncEngine
from typer.testing import CliRunner

from aenv.cli import app
from aenv.stack.process import free_port
from bus import Bus, BusSettings, MessageContext
from bus.backup import verify
from domain import apikey as ak
from domain import template as tp
from domain.sandbox.values import new_sandbox_id
from projections import Projector, all_projections, create_engine, migrate, table_rows
from projections.tables import projection_checkpoints
from tests.integration.projections.conftest import PG
from tests.integration.projections.lifecycle import T0, build_lifecycle, full_lifecycle, kill
from tests.support import eventually_sync

NATS_SERVER = Path(shutil.which("nats-server") or "nats-server")


@pytest.fixture
def fresh_nats(tmp_path: Path) -> Iterator[str]:
    """A nats-server of this test's own, with an empty JetStream store."""
    exe = Path(__file__).resolve().parents[3] / ".venv" / "bin" / "nats-server"
    port = free_port()
    server = str(exe if exe.exists() else NATS_SERVER)
    proc = subprocess.Popen(
        [server, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(tmp_path / "js")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"nats://127.0.0.1:{port}"
        eventually_sync(lambda: _answers(port), timeout=10)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def _answers(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest_asyncio.fixture
async def second_db() -> AsyncIterator[AsyncEngine]:
    """A fresh, migrated database for the read models of the restored log."""
    name = f"aenv_test_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(f"{PG}/postgres")
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        url = f"postgresql+asyncpg://postgres@127.0.0.1:5432/{name}"
        await migrate(url)
        engine = create_engine(url, pool_size=2)
        yield engine
        await engine.dispose()
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def _aenv(args: list[str], prefix: str) -> tuple[int, str]:
    """`aenv …` as an operator types it (in a thread: the command runs its own loop)."""
    result = CliRunner().invoke(app, args, env={"AENV_BUS_PREFIX": prefix})
    return result.exit_code, result.output


async def _write_history(bus: Bus) -> str:
    """Sandboxes, a template, an API key and builds, through decide and append; returns a
    sandbox left running."""
    running = ""
    for i in range(3):
        sid = new_sandbox_id()
        await full_lifecycle(bus, sid)
        if i % 2:
            await kill(bus, sid)
        else:
            running = sid
    tid = f"tpl-{secrets.token_hex(3)}"  # the session's other tests register `base`
    await bus.templates.append(
        tid,
        bus.templates.NEW,
        tp.decide_template(None, tp.RegisterTemplate(template_id=tid, alias=tid, at=T0)),
        context=MessageContext(),
    )
    raw = ak.new_api_key()
    key = ak.CreateApiKey(
        key_id=f"k{secrets.token_hex(3)}",
        team_id="team1",
        prefix=ak.display_prefix(raw),
        key_sha256=ak.hash_api_key(raw),
        at=T0,
    )
    await bus.api_keys.append(
        key.key_id, bus.api_keys.NEW, ak.decide_api_key(None, key), context=MessageContext()
    )
    for fail in (False, True):
        await build_lifecycle(bus, secrets.token_hex(8), fail=fail)
    return running


async def _tables(engine: AsyncEngine) -> dict[str, list[dict[str, object]]]:
    async with engine.connect() as conn:
        out = {t.name: await table_rows(conn, t) for p in all_projections() for t in p.tables}
        out[projection_checkpoints.name] = await table_rows(conn, projection_checkpoints)
    return out


async def test_a_restored_log_rebuilds_identical_read_models(
    bus: Bus,
    engine: AsyncEngine,
    projectors: dict[str, Projector],
    second_db: AsyncEngine,
    fresh_nats: str,
    tmp_path: Path,
) -> None:
    running = await _write_history(bus)
    last = (await bus.js.stream_info(bus.names.event_stream)).state.last_seq
    for p in all_projections():  # the live projectors' tables, up to `last` (a catch-up
        await Projector(engine, bus.js, bus.settings, p).catch_up()  # locks their checkpoint)
    live = await _tables(engine)
    prefix = bus.settings.bus_prefix
    out = tmp_path / "backup"

    code, text = await asyncio.to_thread(
        _aenv, ["log", "backup", "--out", str(out), "--nats-url", bus.settings.nats_url], prefix
    )
    assert code == 0, text
    manifest = verify(out)
    assert manifest.messages == last == manifest.last_seq
    assert json.loads(text.strip().splitlines()[-1])["messages"] == last

    code, text = await asyncio.to_thread(
        _aenv, ["log", "restore", str(out), "--nats-url", fresh_nats], prefix
    )
    assert code == 0, text
    code, text = await asyncio.to_thread(  # a log that is not empty stays as it is
        _aenv, ["log", "restore", str(out), "--nats-url", fresh_nats], prefix
    )
    assert code == 1 and "not empty" in text, text

    restored = await Bus.connect(BusSettings(nats_url=fresh_nats, bus_prefix=prefix))
    try:
        info = await restored.js.stream_info(restored.names.event_stream)
        assert (info.state.first_seq, info.state.last_seq) == (1, last)
        for seq in range(1, last + 1):  # each message as it was: subject, headers, body
            a = await bus.js.get_msg(bus.names.event_stream, seq=seq)
            b = await restored.js.get_msg(restored.names.event_stream, seq=seq)
            guards = {k: v for k, v in (a.headers or {}).items() if k.startswith("Nats-Expected")}
            assert (b.subject, b.data) == (a.subject, a.data)
            assert b.headers == {k: v for k, v in (a.headers or {}).items() if k not in guards}
        for p in all_projections():
            await Projector(second_db, restored.js, restored.settings, p).catch_up()
        rebuilt = await _tables(second_db)
        for table, rows in live.items():
            assert rebuilt[table] == rows, f"{table} differs"
        assert sum(len(rows) for rows in rebuilt.values()) > 10
        # the restored log's sequences are the aggregates' versions: the next append holds
        version = await kill(restored, running)
        assert version.seq == last + 2
    finally:
        await restored.close()
