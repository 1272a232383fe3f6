"""EventStore against real JetStream: append, load, concurrency, dedup."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest

from bus import Bus, ConcurrencyError, MessageContext, Version
from bus import headers as h
from bus.envelope import encode_event
from bus.errors import StaleDuplicate
from domain import sandbox as sb
from domain.sandbox.values import new_sandbox_id

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def create(sid: str) -> sb.CreateSandbox:
    return sb.CreateSandbox(sandbox_id=sid, template_id="base", at=T0, timeout_s=60)


async def test_append_then_load_folds_the_history(bus: Bus) -> None:
    sid = new_sandbox_id()
    store = bus.sandboxes
    state, v = await store.load(sid)
    assert state is None and v == Version(0, 0)
    v = await store.append(sid, v, sb.decide(state, create(sid)))
    state, v2 = await store.load(sid)
    assert v2 == v and v.revision == 1
    done = sb.CompleteCreate(sandbox_id=sid, node_id="n1", at=T0 + timedelta(seconds=1))
    v = await store.append(sid, v, sb.decide(state, done))
    state, v3 = await store.load(sid)
    assert state is not None and state.status is sb.SandboxStatus.RUNNING
    assert v3 == v and v3.revision == 2 and v3.seq > v2.seq
    assert await store.version(sid) == v3
    recs = await store.read(sid)
    assert [r.envelope.aggregate_version for r in recs] == [1, 2]
    assert [r.envelope.type for r in recs] == ["SandboxRequested", "SandboxCreated"]
    assert recs[0].envelope.occurred_at == T0


async def test_two_writers_one_wins(bus: Bus) -> None:
    sid = new_sandbox_id()
    store = bus.sandboxes
    await store.append(sid, Version(0, 0), sb.decide(None, create(sid)))
    (state, v) = await store.load(sid)
    state2 = sb.fold(sb.decide(state, sb.CompleteCreate(sandbox_id=sid, node_id="n", at=T0)), state)
    assert state2 is not None
    # both writers decided from the same version, with different commands
    a = sb.decide(state2, sb.PauseSandbox(sandbox_id=sid, at=T0))
    b = sb.decide(state2, sb.KillSandbox(sandbox_id=sid, at=T0))
    v = await store.append(
        sid, v, sb.decide(state, sb.CompleteCreate(sandbox_id=sid, node_id="n", at=T0))
    )
    results = await asyncio.gather(
        store.append(sid, v, a, context=MessageContext(causation_id=uuid4())),
        store.append(sid, v, b, context=MessageContext(causation_id=uuid4())),
        return_exceptions=True,
    )
    assert sum(isinstance(r, ConcurrencyError) for r in results) == 1
    assert sum(isinstance(r, Version) for r in results) == 1
    assert len(await store.read(sid)) == 3


async def test_new_aggregate_guard(bus: Bus) -> None:
    """expected (0, 0) means "no events yet": a second creator loses."""
    sid = new_sandbox_id()
    await bus.sandboxes.append(sid, Version(0, 0), sb.decide(None, create(sid)))
    with pytest.raises(ConcurrencyError):
        await bus.sandboxes.append(sid, Version(0, 0), sb.decide(None, create(sid)))


async def test_same_event_id_is_stored_once(bus: Bus) -> None:
    sid = new_sandbox_id()
    ctx = MessageContext(causation_id=uuid4())
    events = sb.decide(None, create(sid))
    v1 = await bus.sandboxes.append(sid, Version(0, 0), events, context=ctx)
    # the same decision again (same causation → same event id): a redelivered command.
    # JetStream keeps the first and skips the sequence check, so the caller must reload.
    with pytest.raises(StaleDuplicate) as raised:
        await bus.sandboxes.append(sid, Version(0, 0), events, context=ctx)
    assert raised.value.stored_seq == v1.seq
    assert len(await bus.sandboxes.read(sid)) == 1


async def test_raw_duplicate_publish_reports_duplicate(bus: Bus) -> None:
    sid = new_sandbox_id()
    [event] = sb.decide(None, create(sid))
    eid = uuid4()
    _, data = encode_event(
        event, event_id=eid, aggregate_id=sid, aggregate_version=1, context=MessageContext()
    )
    subject = bus.names.sandbox_events(sid)
    first = await bus.js.publish(subject, data, headers={h.MSG_ID: str(eid)})
    second = await bus.js.publish(subject, data, headers={h.MSG_ID: str(eid)})
    assert not first.duplicate and second.duplicate and second.seq == first.seq


async def test_envelope_carries_context(bus: Bus) -> None:
    sid = new_sandbox_id()
    corr, cause = uuid4(), uuid4()
    await bus.sandboxes.append(
        sid,
        Version(0, 0),
        sb.decide(None, create(sid)),
        context=MessageContext(corr, cause, "apikey:k1"),
    )
    [rec] = await bus.sandboxes.read(sid)
    env = rec.envelope
    assert (env.correlation_id, env.causation_id, env.actor) == (corr, cause, "apikey:k1")
    assert env.schema_version == sb.SandboxRequested.schema_version and env.aggregate_id == sid


async def test_load_is_fast_enough(bus: Bus) -> None:
    """A 50-event aggregate loads in well under the time of a create (guards the read path)."""
    sid = new_sandbox_id()
    state, v = None, Version(0, 0)
    for c in [create(sid), sb.CompleteCreate(sandbox_id=sid, node_id="n", at=T0)]:
        events = sb.decide(state, c)
        v = await bus.sandboxes.append(sid, v, events)
        state = sb.fold(events, state)
    for i in range(48):
        events = sb.decide(state, sb.SetSandboxTimeout(sandbox_id=sid, at=T0, timeout_s=10 + i))
        v = await bus.sandboxes.append(sid, v, events)
        state = sb.fold(events, state)
    loop = asyncio.get_running_loop()
    t = loop.time()
    loaded, lv = await bus.sandboxes.load(sid)
    elapsed = loop.time() - t
    assert loaded == state and lv == v
    assert elapsed < 0.5, elapsed


async def test_load_folds_on_from_its_cache_and_sees_other_writers(bus: Bus) -> None:
    """A process's second load reads only what is new since its last fold — including what
    another process (here: another store on its own connection) appended meanwhile."""
    from bus import BusSettings

    sid = new_sandbox_id()
    store = bus.sandboxes
    state, v = await store.load(sid)
    v = await store.append(sid, v, sb.decide(state, create(sid)))
    cached, _ = await store.load(sid)
    assert cached is not None and cached.status is sb.SandboxStatus.CREATING
    other = await Bus.connect(
        BusSettings(nats_url=bus.settings.nats_url, bus_prefix=bus.settings.bus_prefix)
    )
    try:
        s2, v2 = await other.sandboxes.load(sid)
        done = sb.CompleteCreate(sandbox_id=sid, node_id="n9", at=T0 + timedelta(seconds=1))
        await other.sandboxes.append(sid, v2, sb.decide(s2, done))
    finally:
        await other.close()
    state, v3 = await store.load(sid)
    assert state is not None and state.status is sb.SandboxStatus.RUNNING
    assert state.node_id == "n9" and v3.revision == 2
    assert (await store.load(sid)) == (state, v3)  # unchanged: the cached fold, as is


async def test_load_after_several_foreign_appends_equals_a_fresh_fold(bus: Bus) -> None:
    """The incremental load takes the newest event from its version check and reads only
    those between: with 1, 2 and 3 events appended elsewhere it must fold exactly the same
    state and version as a process that never saw the aggregate."""
    from bus import BusSettings

    sid = new_sandbox_id()
    store = bus.sandboxes
    await store.append(sid, Version(0, 0), sb.decide(None, create(sid)))
    await store.load(sid)
    other = await Bus.connect(
        BusSettings(nats_url=bus.settings.nats_url, bus_prefix=bus.settings.bus_prefix)
    )
    try:
        s, v = await other.sandboxes.load(sid)
        done = sb.CompleteCreate(sandbox_id=sid, node_id="n1", at=T0)
        v = await other.sandboxes.append(sid, v, sb.decide(s, done))
        s = sb.fold(sb.decide(s, done), s)
        for gap in (1, 2, 3):
            for i in range(gap):
                cmd = sb.SetSandboxTimeout(sandbox_id=sid, at=T0, timeout_s=100 * gap + i)
                events = sb.decide(s, cmd)
                v = await other.sandboxes.append(sid, v, events)
                s = sb.fold(events, s)
            fresh = await Bus.connect(
                BusSettings(nats_url=bus.settings.nats_url, bus_prefix=bus.settings.bus_prefix)
            )
            try:
                expected = await fresh.sandboxes.load(sid)
            finally:
                await fresh.close()
            assert await store.load(sid) == expected == (s, v)
    finally:
        await other.close()
