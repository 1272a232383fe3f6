"""kill -9 of the node role while it uploads what a sandbox left in a volume: after the
supervisor restarts it, the volume's content is intact and the volume is released (not
stuck attached to the dead sandbox) — the kill in the log is the to-do list the node's
releaser finds again (`workers/node/volumes/releaser.py`)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from datetime import UTC, datetime

import pytest
from e2b import Sandbox, Volume

from bus import Bus, BusSettings
from domain import sandbox as sb
from domain import volume as vo
from tests.eventwatch import FirstEvent
from tests.reliability.conftest import Stack
from tests.support import eventually_sync

pytestmark = pytest.mark.vm

MOUNT = "/mnt/data"
#: enough data that its upload (hash and put ~32 chunks of 4 MiB) is under way when the
#: node dies a few milliseconds after the kill is recorded
DATA_MIB = 128


def _volume_events(st: Stack, volume_id: str) -> list[tuple[object, datetime]]:
    async def read() -> list[tuple[object, datetime]]:
        bus = await Bus.connect(BusSettings(nats_url=st.nats_url), setup=False)
        try:
            return [(r.event, r.envelope.occurred_at) for r in await bus.volumes.read(volume_id)]
        finally:
            await bus.close()

    return asyncio.run(read())


def _node_pid(st: Stack) -> int:
    roles = st.info()["roles"]
    assert isinstance(roles, dict)
    return int(roles["node"])


def _serving(st: Stack) -> int:
    text = (st.data_dir / "aenv.log").read_text(errors="replace")
    return sum(1 for ln in text.splitlines() if "serving" in ln and "sandbox proxy" in ln)


def test_node_killed_during_a_volume_upload_loses_nothing(rstack: Stack) -> None:
    vol = Volume.create(f"fault-{uuid.uuid4().hex[:8]}")
    a = Sandbox.create(timeout=600, volume_mounts={MOUNT: vol})
    digest = a.commands.run(
        f"head -c {DATA_MIB}M /dev/urandom > {MOUNT}/data.bin && echo small > {MOUNT}/s.txt "
        f"&& sha256sum {MOUNT}/data.bin",
        timeout=600,
    ).stdout.split()[0]

    pid, serving = _node_pid(rstack), _serving(rstack)
    watch = FirstEvent(rstack.nats_url, sb.SandboxKilled)
    a.kill()  # answers once SandboxKilled is in the log: the upload starts right then
    assert watch.seen.wait(60)
    os.kill(pid, signal.SIGKILL)
    killed_at = datetime.now(UTC)
    eventually_sync(lambda: _node_pid(rstack) != pid, timeout=120, interval=0.2)
    eventually_sync(lambda: _serving(rstack) > serving, timeout=300, interval=0.5)

    def released() -> list[tuple[object, datetime]] | None:
        got = [
            (e, t)
            for e, t in _volume_events(rstack, vol.volume_id)
            if isinstance(e, vo.VolumeReleased)
        ]
        return got or None

    done = eventually_sync(released, timeout=300, interval=1)
    assert len(done) == 1, done  # released once, not twice
    event, at = done[0]
    assert isinstance(event, vo.VolumeReleased) and event.version is not None
    assert event.holder == a.sandbox_id and not event.forced
    # the node died before it recorded the release: its restart did it (the fault hit the
    # upload, not a finished one)
    assert at > killed_at, (at, killed_at)

    t0 = time.monotonic()
    b = Sandbox.create(timeout=600, volume_mounts={MOUNT: vol.name})
    try:
        assert time.monotonic() - t0 < 120
        got = b.commands.run(
            f"sha256sum {MOUNT}/data.bin && cat {MOUNT}/s.txt", timeout=600
        ).stdout.split()
        assert got[0] == digest and got[-1] == "small"
    finally:
        b.kill()
    eventually_sync(lambda: len(released() or []) == 2, timeout=300, interval=1)
    assert Volume.destroy(vol.volume_id)
