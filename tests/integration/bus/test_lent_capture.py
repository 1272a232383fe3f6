"""A paused sandbox's capture lent to its forks (`api/pausefork.py`), as the repository
janitor tidies it, over real NATS and SeaweedFS: the lent template's deletion leaves the
manifest (it is the sandbox's: a resume elsewhere needs it); the sandbox's kill deletes the
lent template in the log and on every node beating (each may hold a copy), then the
manifest; a redelivered kill does it again without error."""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from aenv.stack import S3Endpoint
from bus import Bus
from bus.commands import verb_of
from bus.decisions import execute
from bus.nodes import Heartbeat, NodeBook
from domain import sandbox as sb
from domain import template as tp
from tests.contract.snapshot.builders import build_snapshot
from tests.contract.snapshot.conftest import s3_config, s3_endpoint
from tests.integration.bus.test_repository_gc import record
from workers.snapshot import BlobCache, S3Store, SnapshotRepository
from workers.snapshot.janitor import RepositoryJanitor

__all__ = ["s3_endpoint"]


@pytest.fixture
async def repo(s3_endpoint: S3Endpoint, tmp_path: Path) -> AsyncIterator[SnapshotRepository]:
    store = await S3Store.open(s3_config(s3_endpoint))
    try:
        yield SnapshotRepository(store, BlobCache(tmp_path / "cache", 1 << 30))
    finally:
        await store.close()


async def test_a_lent_capture_stays_its_sandboxs_and_goes_with_its_kill(
    bus: Bus, repo: SnapshotRepository, tmp_path: Path
) -> None:
    run = secrets.token_hex(3)
    sid, capture = f"sbx{run}", f"sbx{run}-p{run}"
    snap = build_snapshot(tmp_path / "node", capture)
    await repo.upload(snap.dir, base_image_digest="1" * 64, snapshot_id=capture)
    paused = sb.SandboxPaused(
        sandbox_id=sid, remaining_s=60, at=datetime.now(UTC), snapshot_id=capture
    )
    await record(bus, sid, paused)
    lent = tp.paused_capture_template(capture)
    await execute(bus.templates, tp.RegisterTemplate(template_id=lent, capture_id=capture))
    await execute(
        bus.templates, tp.RecordTemplateUpload(template_id=lent, key=capture, source_sandbox_id=sid)
    )
    book = await NodeBook.open(bus.js, bus.names.nodes_bucket)
    node = f"n{run}"
    await book.beat(Heartbeat(node_id=node, at=time.time()))
    janitor = RepositoryJanitor(bus, repo.store, kill_settle_s=0)

    # deleted by hand (`DELETE /templates/paused-…`): the manifest stays the sandbox's
    await execute(bus.templates, tp.DeleteTemplate(template_id=lent))
    deleted = [r for r in await bus.templates.read(lent) if isinstance(r.event, tp.TemplateDeleted)]
    assert await janitor.tidy(deleted[-1]) == []
    assert capture in await repo.list()

    # forked again (registered anew), then the sandbox is killed: all of it goes
    await execute(bus.templates, tp.RegisterTemplate(template_id=lent, capture_id=capture))
    await execute(
        bus.templates, tp.RecordTemplateUpload(template_id=lent, key=capture, source_sandbox_id=sid)
    )
    await record(bus, sid, sb.SandboxKilled(sandbox_id=sid, at=datetime.now(UTC)))
    killed = [r for r in await bus.sandboxes.read(sid) if isinstance(r.event, sb.SandboxKilled)]
    assert await janitor.tidy(killed[0]) == [capture]
    state, _ = await bus.templates.load(lent)
    assert state is not None and state.deleted
    assert capture not in await repo.list()
    subject = bus.names.node_command(node, verb_of(tp.DeleteTemplate(template_id=lent)))
    sent = await bus.js.get_last_msg(bus.names.command_stream, subject)
    assert lent.encode() in sent.data  # the node that may hold a copy is told to drop it
    assert await janitor.tidy(killed[0]) == []  # redelivered: nothing left, no error
