"""Exactly-once projection (checkpoint + effect in one transaction), rebuild equality,
and the migrations matching the tables."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Table, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from bus import AggregateKind, Bus, MessageContext, RecordedEvent, Version
from bus.decisions import execute
from domain import apikey as ak
from domain import image as im
from domain import template as tp
from domain import volume as vo
from domain.sandbox.values import new_sandbox_id
from projections import (
    Projector,
    all_projections,
    checkpoints,
    migrate,
    rebuild,
    table_rows,
)
from projections.tables import metadata
from tests.integration.projections.lifecycle import T0, build_lifecycle, full_lifecycle, kill


class Boom(Exception):
    pass


class CountingProjection:
    """Appends one row per event with no uniqueness: any double apply would show."""

    name = "crash_test"
    kind = AggregateKind.SANDBOX
    tables: tuple[Table, ...] = ()

    def __init__(self) -> None:
        self.explode_on_call: int | None = None
        self.calls = 0

    async def apply(self, conn: AsyncConnection, batch: Sequence[RecordedEvent]) -> None:
        self.calls += 1
        for rec in batch:
            await conn.execute(text("INSERT INTO crash_log (seq) VALUES (:s)"), {"s": rec.seq})
        if self.calls == self.explode_on_call:
            raise Boom("crash after the effect, before the checkpoint")


async def test_crash_between_apply_and_checkpoint_applies_nothing_twice(
    bus: Bus, engine: AsyncEngine
) -> None:
    for _ in range(3):
        await full_lifecycle(bus, new_sandbox_id())
    async with engine.begin() as conn:
        await conn.execute(text("CREATE TABLE crash_log (seq bigint NOT NULL)"))
    proj = CountingProjection()
    proj.explode_on_call = 2
    runner = Projector(engine, bus.js, bus.settings, proj, max_batch=5)
    with pytest.raises(Boom):
        await runner.catch_up()
    async with engine.connect() as conn:
        logged = (await conn.execute(text("SELECT seq FROM crash_log"))).scalars().all()
        cp = await checkpoints.read(conn, "crash_test")
    assert cp == max(logged) and len(logged) == len(set(logged))  # batch 2 rolled back whole

    # restart: resumes from the checkpoint; then running again is a no-op
    restarted = Projector(engine, bus.js, bus.settings, proj, max_batch=5)
    last = await restarted.catch_up()
    await Projector(engine, bus.js, bus.settings, proj, max_batch=5).catch_up()
    async with engine.connect() as conn:
        logged = (await conn.execute(text("SELECT seq FROM crash_log ORDER BY seq"))).scalars()
        logged = list(logged)
        cp = await checkpoints.read(conn, "crash_test")
    every = [r.seq for sid in await _sandbox_ids(bus) for r in await bus.sandboxes.read(sid)]
    assert logged == sorted(every) and cp == last == max(every)


async def _sandbox_ids(bus: Bus) -> list[str]:
    info = await bus.js.stream_info(
        bus.names.event_stream, subjects_filter=bus.names.events_of_kind(AggregateKind.SANDBOX)
    )
    return [bus.names.aggregate_id_of(s) for s in (info.state.subjects or {})]


async def test_rebuild_reproduces_the_live_tables(
    bus: Bus, engine: AsyncEngine, projectors: dict[str, Projector]
) -> None:
    for i in range(4):
        sid = new_sandbox_id()
        await full_lifecycle(bus, sid)
        if i % 2:
            await kill(bus, sid)
    t = await bus.templates.append(
        "base",
        bus.templates.NEW,
        tp.decide_template(None, tp.RegisterTemplate(template_id="base", alias="base", at=T0)),
        context=MessageContext(),
    )
    raw = ak.new_api_key()
    k = await bus.api_keys.append(
        "k1",
        bus.api_keys.NEW,
        ak.decide_api_key(
            None,
            ak.CreateApiKey(
                key_id="k1",
                team_id="team1",
                prefix=ak.display_prefix(raw),
                key_sha256=ak.hash_api_key(raw),
                at=T0,
            ),
        ),
    )
    builds = [await build_lifecycle(bus, str(uuid.uuid4()), fail=f) for f in (False, True)]
    volumes = [
        await _volume_lifecycle(bus, name, destroy=d)
        for name, d in (("kept", False), ("gone", True))
    ]
    images = [await _image_lifecycle(bus, end) for end in ("published", "failed", "forgotten")]
    last = await bus.sandboxes.version(sid)
    await projectors["sandboxes"].wait_for(last.seq)
    await projectors["template_builds"].wait_for(max(b.seq for b in builds))
    await projectors["templates"].wait_for(t.seq)
    await projectors["api_keys"].wait_for(k.seq)
    await projectors["volumes"].wait_for(max(v.seq for v in volumes))
    await projectors["images"].wait_for(max(i.seq for i in images))

    for projection in all_projections():
        before = await _dump(engine, projection.tables)
        report = await rebuild(engine, bus.js, bus.settings, projection, swap=False)
        assert report.identical, report.differences
        assert sum(report.rows.values()) == sum(len(v) for v in before.values())
        report = await rebuild(engine, bus.js, bus.settings, projection, swap=True)
        assert report.swapped and report.identical
        assert await _dump(engine, projection.tables) == before
        async with engine.connect() as conn:
            leftovers = await conn.scalar(
                text("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'rebuild_%'")
            )
        assert leftovers == 0
    assert before  # the last projection's tables were not empty either


async def _volume_lifecycle(bus: Bus, name: str, *, destroy: bool) -> Version:
    """A volume created, attached to a sandbox, released with a version, destroyed or not."""
    vid = vo.volume_id_of("team1", name)
    steps: list[vo.AnyVolumeCommand] = [
        vo.CreateVolume(volume_id=vid, team_id="team1", name=name, token_sha256="a" * 64, at=T0),
        vo.AttachVolume(volume_id=vid, holder="sbx1", node_id="n1", at=T0),
        vo.ReleaseVolume(
            volume_id=vid,
            holder="sbx1",
            node_id="n1",
            at=T0,
            version=vo.VolumeVersion(key=f"vol-{vid}-sbx1", size_bytes=4096, node_id="n1"),
        ),
        vo.AttachVolume(volume_id=vid, holder="sbx2", node_id="n2", at=T0),
    ]
    if destroy:
        steps += [
            vo.ReleaseVolume(volume_id=vid, holder="sbx2", at=T0),
            vo.DestroyVolume(volume_id=vid, at=T0),
        ]
    version = bus.volumes.NEW
    for cmd in steps:
        _, version, _ = await execute(bus.volumes, cmd)
    return version


async def _image_lifecycle(bus: Bus, end: str) -> Version:
    """A recipe claimed, renewed, then published, failed, or published and forgotten."""
    iid = im.image_aggregate_id(uuid.uuid4().hex * 2)
    steps: list[im.AnyImageCommand] = [
        im.ClaimImageBuild(image_id=iid, node_id="n1", at=T0),
        im.ClaimImageBuild(image_id=iid, node_id="n1", at=T0),
    ]
    publish = im.PublishImage(
        image_id=iid, digest="d" * 64, stored_bytes=4096, size=1 << 30, role="root", at=T0
    )
    if end == "failed":
        steps.append(im.FailImageBuild(image_id=iid, node_id="n1", reason="no space", at=T0))
    else:
        steps.append(publish)
    if end == "forgotten":
        steps.append(im.ForgetImage(image_id=iid, at=T0))
    version = bus.images.NEW
    for cmd in steps:
        _, version, _ = await execute(bus.images, cmd)
    return version


async def _dump(engine: AsyncEngine, tables: Sequence[Table]) -> dict[str, list[dict[str, object]]]:
    async with engine.connect() as conn:
        return {t.name: await table_rows(conn, t) for t in tables}


async def test_migrations_match_the_tables(db_url: str, engine: AsyncEngine) -> None:
    await migrate(db_url)  # idempotent: already at head

    def diff(conn: Connection) -> list[object]:
        ctx = MigrationContext.configure(
            conn,
            opts={
                "include_object": lambda o, name, type_, r, c: (
                    name != "nodes" and name != "crash_log"
                )
            },
        )
        return list(compare_metadata(ctx, metadata))

    async with engine.connect() as conn:
        assert await conn.run_sync(diff) == []
