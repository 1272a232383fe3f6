"""RL pipelines drive aenv without HTTP: a create published straight to NATS as JSON (the
shape `aenv schema` documents), then the sandbox is visible and usable through the API."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime

import httpx
import nats
import pytest
from e2b import Sandbox

from tests.e2e.conftest import Stack
from tests.support import eventually

pytestmark = pytest.mark.vm


def create_command(sandbox_id: str, team_id: str) -> tuple[str, bytes]:
    command_id = str(uuid.uuid4())
    now = datetime.now(UTC).isoformat()
    doc = {
        "type": "CreateSandbox",
        "schema_version": 1,
        "aggregate_id": sandbox_id,
        "command_id": command_id,
        "issued_at": now,
        "actor": "rl-pipeline",
        "payload": {
            "command_id": command_id,
            "at": now,
            "sandbox_id": sandbox_id,
            "template_id": "base",
            "team_id": team_id,
            "cpu_count": 1,
            "memory_mb": 512,
            "timeout_s": 120,
            "metadata": {"via": "nats"},
        },
    }
    return command_id, json.dumps(doc).encode()


async def test_create_published_to_nats_shows_up_in_the_api(stack: Stack) -> None:
    sandbox_id = "pipe" + uuid.uuid4().hex[:12]
    command_id, body = create_command(sandbox_id, team_id="default")
    nc = await nats.connect(stack.nats_url)
    try:
        js = nc.jetstream()
        for _ in range(2):  # published twice: JetStream dedup runs it once
            await js.publish("aenv.cmd.place.create", body, headers={"Nats-Msg-Id": command_id})
    finally:
        await nc.close()

    async with httpx.AsyncClient(base_url=stack.api_url, timeout=30) as c:

        async def visible() -> dict[str, object] | None:
            r = await c.get(f"/sandboxes/{sandbox_id}", headers={"X-API-KEY": stack.api_key})
            return r.json() if r.status_code == 200 else None

        info = await eventually(visible, timeout=60, interval=0.2)
        assert info["metadata"] == {"via": "nats"} and info["state"] == "running"

    def use() -> str:
        sbx = Sandbox.connect(sandbox_id)
        out = sbx.commands.run("echo from-pipeline").stdout
        sbx.kill()
        return out

    assert (await asyncio.to_thread(use)).strip() == "from-pipeline"


async def test_a_create_the_log_refuses_leaves_no_vm_behind(stack: Stack) -> None:
    """The node starts a create's VM while it appends the decision; when the log refuses
    the create (here: the sandbox id exists, written by another process the node never
    heard from), that early VM must go."""
    from bus import Bus, BusSettings
    from bus.decisions import execute
    from domain import CommandRejected
    from domain import sandbox as sb

    sandbox_id = "dup" + uuid.uuid4().hex[:12]
    log = stack.data_dir / "aenv.log"
    bus = await Bus.connect(BusSettings(nats_url=stack.nats_url), setup=False)
    try:
        await execute(
            bus.sandboxes,
            sb.CreateSandbox(
                sandbox_id=sandbox_id, template_id="base", team_id="default", timeout_s=60
            ),
        )
        await execute(bus.sandboxes, sb.KillSandbox(sandbox_id=sandbox_id))
        await execute(bus.sandboxes, sb.CompleteKill(sandbox_id=sandbox_id))
        command_id, body = create_command(sandbox_id, team_id="default")
        await bus.js.publish("aenv.cmd.place.create", body, headers={"Nats-Msg-Id": command_id})

        async def refused() -> bool:
            return any(
                isinstance(r.event, CommandRejected) and "already exists" in r.event.reason
                for r in await bus.sandboxes.read(sandbox_id)
            )

        await eventually(refused, timeout=60, interval=0.2)
    finally:
        await bus.close()

    async def logged(line: str) -> bool:
        return line in log.read_text(errors="replace")

    # the early VM really started (so this tested its removal), and is gone
    await eventually(lambda: logged(f"sandbox {sandbox_id} up:"), timeout=30, interval=0.2)

    vm_dir = stack.data_dir / "node" / "vms" / sandbox_id

    async def no_vm() -> bool:  # its QEMU gone, then its directory (restored or warm alike)
        return not vm_dir.exists()

    await eventually(no_vm, timeout=30, interval=0.2)
    assert not (stack.data_dir / "node" / "journal" / f"{sandbox_id}.json").exists()
