"""The node worker over real NATS with the in-memory host: a fork done again (its first
delivery requested the children, then the node died) gives each child's guest the access
token the log holds for it — not a fresh one nobody can present."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from bus import Bus
from bus.decisions import execute
from domain import sandbox as sb
from domain.sandbox.values import new_sandbox_id
from tests.support import eventually
from workers.node.memory import MemoryHost
from workers.node.settings import NodeSettings
from workers.node.worker import NodeWorker


async def test_a_redone_fork_gives_each_child_the_token_its_log_has(
    bus: Bus, tmp_path: Path
) -> None:
    host = MemoryHost(capacity=8)
    worker = NodeWorker(
        bus, host, NodeSettings(node_id="forkredo", node_host="memory", state_dir=tmp_path)
    )
    await worker.start()
    try:
        sid = new_sandbox_id()
        now = datetime.now(UTC)
        await bus.commands.to_placement(
            sb.CreateSandbox(
                sandbox_id=sid,
                template_id="base",
                at=now,
                timeout_s=600,
                envd_access_token="parent-token",
            )
        )

        async def running() -> bool:
            state, _ = await bus.sandboxes.load(sid)
            return state is not None and state.status is sb.SandboxStatus.RUNNING

        await eventually(running, timeout=20)
        # the first delivery of the fork got as far as its child's request, then died
        fork = sb.ForkSandbox(sandbox_id=sid, at=now, count=1, timeout_s=600)
        state, _, _ = await execute(bus.sandboxes, fork)
        assert state is not None
        [cid] = state.pending_children
        child = sb.fork_child_command(state, cid, fork).model_copy(
            update={"envd_access_token": "logged-token", "node_id": "forkredo"}
        )
        await execute(bus.sandboxes, child)
        # ...and is delivered again
        await bus.commands.to_node("forkredo", fork)

        async def child_runs() -> bool:
            state, _ = await bus.sandboxes.load(cid)
            return state is not None and state.status is sb.SandboxStatus.RUNNING

        await eventually(child_runs, timeout=20)
        assert host.live[cid].guest.access_token == "logged-token"
    finally:
        await worker.stop()
