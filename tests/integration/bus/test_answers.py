"""Answers to commands come from the log (real JetStream): a refused append never answers,
and every stored sandbox event keeps the process's store cache current."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from uuid import uuid4

import pytest
import pytest_asyncio
from nats.aio.msg import Msg

from bus import Bus, BusSettings, MessageContext, Version
from bus import headers as h
from bus.envelope import encode_event
from domain import sandbox as sb
from domain.sandbox.values import new_sandbox_id
from tests.support import eventually

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest_asyncio.fixture
async def watcher(bus_settings: BusSettings, bus: Bus) -> AsyncIterator[Bus]:
    """A process that waits on answers (an API). Its own bus: the session's must not
    follow the log, other tests keep its cache stale on purpose."""
    b = await Bus.connect(bus_settings, name="watcher", setup=False)
    yield b
    await b.close()


@pytest_asyncio.fixture
async def other(bus_settings: BusSettings, bus: Bus) -> AsyncIterator[Bus]:
    """A second process's bus (a node): its appends are news to `watcher`."""
    b = await Bus.connect(bus_settings, name="other", setup=False)
    yield b
    await b.close()


def _async(check: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        return check()

    return probe


def _create(sid: str) -> sb.CreateSandbox:
    return sb.CreateSandbox(sandbox_id=sid, template_id="base", at=T0, timeout_s=60)


async def test_the_answer_is_the_stored_event_and_a_refused_append_is_none(
    watcher: Bus, other: Bus
) -> None:
    sid = new_sandbox_id()
    v = await other.sandboxes.append(sid, Version(0, 0), sb.decide(None, _create(sid)))
    command_id = uuid4()
    answers = await watcher.answers()
    answer = answers.expect(str(command_id), lambda rec: isinstance(rec.event, sb.SandboxCreated))
    seen_on_the_subject: list[Msg] = []

    async def spy(msg: Msg) -> None:
        seen_on_the_subject.append(msg)

    sub = await watcher.nc.subscribe(watcher.names.sandbox_events(sid), cb=spy)
    try:
        # an append the stream refuses (wrong expected sequence), caused by our command
        done = sb.CompleteCreate(sandbox_id=sid, node_id="n1", at=T0)
        state, _ = await other.sandboxes.load(sid)
        [event] = sb.decide(state, done)
        _, data = encode_event(
            event,
            event_id=uuid4(),
            aggregate_id=sid,
            aggregate_version=2,
            context=MessageContext(causation_id=command_id),
        )
        refused = {h.MSG_ID: str(uuid4()), h.EXPECTED_LAST_SUBJECT_SEQUENCE: str(v.seq + 99)}
        with pytest.raises(Exception, match="wrong last sequence"):
            await watcher.js.publish(watcher.names.sandbox_events(sid), data, headers=refused)
        await eventually(_async(lambda: len(seen_on_the_subject) == 1))  # a subscriber saw it...
        await asyncio.sleep(0.3)
        assert not answer.done()  # ...the answer did not
        stored = await other.sandboxes.append(
            sid, v, [event], context=MessageContext(causation_id=command_id)
        )
        rec = await asyncio.wait_for(answer, 5)
        assert rec.seq == stored.seq and rec.envelope.aggregate_version == 2
    finally:
        answers.forget(str(command_id))
        await sub.unsubscribe()


async def test_stored_events_keep_the_cached_state_current(watcher: Bus, other: Bus) -> None:
    await watcher.answers()
    sid = new_sandbox_id()
    # a sandbox this process never loaded: its first event seeds the cache
    v = await other.sandboxes.append(sid, Version(0, 0), sb.decide(None, _create(sid)))
    await eventually(_async(lambda: watcher.sandboxes.cached(sid) is not None))
    assert watcher.sandboxes.cached(sid) == (await other.sandboxes.load(sid))
    state, _ = await other.sandboxes.load(sid)
    done = sb.decide(state, sb.CompleteCreate(sandbox_id=sid, node_id="n1", at=T0))
    v = await other.sandboxes.append(sid, v, done)
    await eventually(_async(lambda: (watcher.sandboxes.cached(sid) or (None, None))[1] == v))
    cached = watcher.sandboxes.cached(sid)
    assert cached is not None and cached[0] is not None
    assert cached[0].status is sb.SandboxStatus.RUNNING
    assert await watcher.sandboxes.load(sid) == await other.sandboxes.load(sid)


async def test_an_event_that_does_not_follow_the_cache_leaves_it_alone(
    watcher: Bus, other: Bus
) -> None:
    sid = new_sandbox_id()
    v = await other.sandboxes.append(sid, Version(0, 0), sb.decide(None, _create(sid)))
    state, _ = await other.sandboxes.load(sid)
    await watcher.sandboxes.load(sid)
    rec = (await other.sandboxes.read(sid))[0]
    watcher.sandboxes.observe(rec)  # seen again (a redelivery): not the next one
    assert watcher.sandboxes.cached(sid) == (state, v)


async def test_send_and_wait_returns_the_stored_answer_or_none_on_silence(
    watcher: Bus, other: Bus
) -> None:
    sid = new_sandbox_id()
    v = await other.sandboxes.append(sid, Version(0, 0), sb.decide(None, _create(sid)))
    kill = sb.KillSandbox(sandbox_id=sid, at=T0)
    # nobody handles the command: silence within the bound is None, not an error
    assert (
        await watcher.send_and_wait(kill, node_id="nobody", until=(sb.SandboxKilled,), timeout=0.3)
        is None
    )

    async def node_answers() -> None:  # a "node" answering the next kill from the log
        await asyncio.sleep(0.2)
        state, _ = await other.sandboxes.load(sid)
        await other.sandboxes.append(
            sid, v, sb.decide(state, kill2), context=MessageContext(causation_id=kill2.command_id)
        )

    kill2 = sb.KillSandbox(sandbox_id=sid, at=T0)
    task = asyncio.create_task(node_answers())
    rec = await watcher.send_and_wait(
        kill2, node_id="nobody", until=(sb.SandboxKillRequested,), timeout=5
    )
    await task
    assert rec is not None and isinstance(rec.event, sb.SandboxKillRequested)
    assert rec.envelope.causation_id == kill2.command_id


async def test_a_kill_that_overtakes_a_command_ends_its_wait(watcher: Bus, other: Bus) -> None:
    """Issue 16: a pause overtaken by a kill waited out its whole timeout (then 504): the
    pause gets no answer of its own once the sandbox is killed."""
    sid = new_sandbox_id()
    v = await other.sandboxes.append(sid, Version(0, 0), sb.decide(None, _create(sid)))
    state, _ = await other.sandboxes.load(sid)
    v = await other.sandboxes.append(
        sid, v, sb.decide(state, sb.CompleteCreate(sandbox_id=sid, node_id="n1", at=T0))
    )
    pause = sb.PauseSandbox(sandbox_id=sid, at=T0)
    waiting = asyncio.create_task(
        watcher.send_and_wait(pause, node_id="nobody", until=(sb.SandboxPaused,), timeout=30)
    )
    await asyncio.sleep(0.3)
    for cmd in (sb.KillSandbox(sandbox_id=sid, at=T0), sb.CompleteKill(sandbox_id=sid, at=T0)):
        state, v = await other.sandboxes.load(sid)
        v = await other.sandboxes.append(sid, v, sb.decide(state, cmd))
    rec = await asyncio.wait_for(waiting, 5)
    assert rec is not None and isinstance(rec.event, sb.SandboxKilled)
