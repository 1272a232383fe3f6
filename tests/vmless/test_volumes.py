"""Volumes' control plane without VMs: the E2B SDK's `Volume` routes, a create that mounts
one (attached in the log by the node that takes it), one sandbox at a time, the release
when it ends, destroy; and a race no API saw — two creates straight to NATS for one
volume — settled by the log: one runs, the other fails with code conflict (a 409 where an
API waits for it). The images are the memory host's records: nothing is made durable."""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import pytest
from e2b import Sandbox, Volume
from e2b.exceptions import SandboxException, VolumeException, VolumeNotFoundException

from bus import Bus, MessageContext
from domain import sandbox as sb
from domain import volume as vo
from tests.support import eventually_sync
from tests.vmless.conftest import VmlessStack

MOUNT = "/mnt/data"


pytestmark = pytest.mark.usefixtures("sdk_env")


def _events(stack: VmlessStack, kind: str, aggregate_id: str) -> list[object]:
    async def read() -> list[object]:
        bus = await Bus.connect(stack.bus_settings, setup=False)
        try:
            store = bus.volumes if kind == "volume" else bus.sandboxes
            return [r.event for r in await store.read(aggregate_id)]
        finally:
            await bus.close()

    return asyncio.run(read())


def test_a_volume_is_created_mounted_released_and_destroyed(vmless: VmlessStack) -> None:
    name = f"v-{uuid.uuid4().hex[:8]}"
    vol = Volume.create(name)
    assert len(vol.token or "") > 20 and name in [v.name for v in Volume.list()]
    assert Volume.get_info(vol.volume_id).token == vol.token
    with pytest.raises(VolumeException, match="already exists"):
        Volume.create(name)
    with httpx.Client(base_url=vmless.api_url, headers={"X-API-KEY": vmless.api_key}) as c:
        assert c.post("/volumes", json={"name": "bad/name"}).status_code == 400
        assert c.get("/volumes/nosuchvolume").status_code == 404
        # the content API takes the volume's token, never an API key
        r = c.get(f"/volumecontent/{vol.volume_id}/dir", params={"path": "/"})
        assert r.status_code == 401
        r = c.get(
            f"/volumecontent/{vol.volume_id}/dir",
            params={"path": "/"},
            headers={"Authorization": "Bearer wrong"},
        )
        assert r.status_code == 401

    a = Sandbox.create(timeout=120, volume_mounts={MOUNT: vol})
    assert a.get_info().volume_mounts == [{"name": name, "path": MOUNT}]
    with pytest.raises(SandboxException, match=a.sandbox_id):
        Sandbox.create(timeout=60, volume_mounts={"/other": name})
    with pytest.raises(SandboxException, match="volumes mounted"):
        a.fork(count=1)
    with pytest.raises(VolumeException, match=a.sandbox_id):
        Volume.destroy(vol.volume_id)
    a.pause()
    with pytest.raises(SandboxException, match=a.sandbox_id):  # paused: still its holder
        Sandbox.create(timeout=60, volume_mounts={MOUNT: name})
    Sandbox.connect(a.sandbox_id, timeout=120)
    a.kill()
    b = Sandbox.create(timeout=120, volume_mounts={MOUNT: name})  # waits for the release
    b.kill()
    assert Volume.destroy(vol.volume_id) is True
    with pytest.raises(VolumeNotFoundException):
        Volume.get_info(vol.volume_id)
    kinds = [type(e).__name__ for e in _events(vmless, "volume", vol.volume_id)]
    assert kinds == [
        "VolumeCreated",
        "VolumeAttached",
        "VolumeReleased",
        "VolumeAttached",
        "VolumeReleased",
        "VolumeDestroyed",
    ]


def test_two_creates_racing_for_a_volume_are_settled_by_the_log(vmless: VmlessStack) -> None:
    """Pipelines publish creates to NATS: no API looks first. Both name the same volume;
    the node attaches it to the first, the second fails with code conflict."""
    vol = Volume.create(f"race-{uuid.uuid4().hex[:8]}")
    info = Volume.get_info(vol.volume_id)
    team = _events(vmless, "volume", vol.volume_id)[0]
    assert isinstance(team, vo.VolumeCreated)
    mount = sb.VolumeMount(name=info.name, path=MOUNT, volume_id=vol.volume_id)
    ids = [sb.new_sandbox_id(), sb.new_sandbox_id()]

    async def publish() -> None:
        bus = await Bus.connect(vmless.bus_settings, setup=False)
        try:
            for sid in ids:
                cmd = sb.CreateSandbox(
                    sandbox_id=sid,
                    template_id="base",
                    team_id=team.team_id,
                    timeout_s=60,
                    volume_mounts=(mount,),
                )
                await bus.commands.to_placement(cmd, context=MessageContext(actor="pipeline"))
        finally:
            await bus.close()

    asyncio.run(publish())

    def outcomes() -> list[object] | None:
        last = [_events(vmless, "sandbox", sid)[-1:] for sid in ids]
        done = [e[0] for e in last if e and isinstance(e[0], sb.SandboxCreated | sb.SandboxFailed)]
        return done if len(done) == 2 else None

    done = eventually_sync(outcomes, timeout=30, interval=0.2)
    created = [e for e in done if isinstance(e, sb.SandboxCreated)]
    failed = [e for e in done if isinstance(e, sb.SandboxFailed)]
    assert len(created) == 1 and len(failed) == 1, done
    assert failed[0].code == "conflict" and created[0].sandbox_id in failed[0].reason
    for sid in ids:
        Sandbox.kill(sid)
    eventually_sync(lambda: not _held(vmless, vol.volume_id), timeout=30, interval=0.2)
    assert Volume.destroy(vol.volume_id)


def _held(stack: VmlessStack, volume_id: str) -> bool:
    state = vo.fold_volume(_events(stack, "volume", volume_id))  # type: ignore[arg-type]
    return state is not None and state.held


def test_the_cli_creates_lists_and_removes_volumes(vmless: VmlessStack) -> None:
    name = f"cli-{uuid.uuid4().hex[:8]}"
    made = vmless.aenv("volume", "create", name)
    assert made.returncode == 0, made.stderr
    volume_id = made.stdout.strip()
    assert volume_id == vo.volume_id_of("default", name) or len(volume_id) == 20
    again = vmless.aenv("volume", "create", name)
    assert again.returncode == 1 and "already exists" in again.stderr
    listed = vmless.aenv("volume", "ls", "-o", "json")
    assert listed.returncode == 0 and {"volume_id": volume_id, "name": name} in json.loads(
        listed.stdout
    )
    bad = vmless.aenv("start", "-d", "-v", "no-colon")
    assert bad.returncode == 2 and "NAME:/PATH" in bad.stderr
    gone = vmless.aenv("volume", "rm", name)
    assert gone.returncode == 0, gone.stderr
    missing = vmless.aenv("volume", "rm", name)
    assert missing.returncode == 1 and "no such volume" in missing.stderr
