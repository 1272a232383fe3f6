"""A pipeline that drives aenv over NATS and audits one rollout from the event log.

RL pipelines at scale publish their creates straight to the bus rather than through HTTP
(no API in the hot path, a create waits for room instead of failing) and keep the log as
the record of what each rollout did. Here: N sandboxes created through the pipeline client
(`aenv_pipeline`, `pip install ./clients/python`), a few at a time; one rollout's history
replayed and checked against the API's read model while it runs and after its kill.

    AENV_NATS_URL=nats://127.0.0.1:4222 [AENV_BUS_PREFIX=…] [AENV_PIPELINE_TEAM=default] \\
    [AENV_NATS_USER=… AENV_NATS_PASSWORD=…] \\
    E2B_API_URL=... E2B_API_KEY=... python examples/pipeline.py [N]

With AENV_NATS_USER/AENV_NATS_PASSWORD from `aenv keys pipeline create --team T` it runs
with least privilege (`scoped`): its commands go through the team's ingress, its reads
come from the team's own stream, and NATS refuses it everything else.

Prints one JSON line: the sandboxes, each create's time, the audited rollout's history
and the audit's findings (none when the log and the read model agree).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

import aenv_pipeline
from aenv_pipeline import Pipeline

#: creates in flight at once: what rollout frameworks pace theirs at (4-16)
CONCURRENCY = 4


def read_model(sandbox_id: str) -> dict[str, Any]:
    """`GET /sandboxes/{id}` of the API (empty for a 404: a killed sandbox)."""
    url = f"{os.environ['E2B_API_URL'].rstrip('/')}/sandboxes/{sandbox_id}"
    request = urllib.request.Request(url, headers={"X-API-KEY": os.environ["E2B_API_KEY"]})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            body: dict[str, Any] = json.loads(r.read())
            return body
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return {}
        raise


async def create(p: Pipeline, gate: asyncio.Semaphore, run: str, i: int) -> tuple[str, float]:
    async with gate:
        t0 = time.monotonic()
        out = await p.create_sandbox("base", timeout_s=300, metadata={"run": run, "i": str(i)})
        return out.sandbox_id, round(time.monotonic() - t0, 3)


async def audit(p: Pipeline, sandbox_id: str) -> list[dict[str, Any]]:
    body = await asyncio.to_thread(read_model, sandbox_id)
    return [m.__dict__ for m in await p.verify(sandbox_id, body)]


async def main(n: int) -> dict[str, Any]:
    run = "pipe-" + uuid.uuid4().hex[:8]
    user = os.environ.get("AENV_NATS_USER")  # a scoped login, else the stack's own
    p = await aenv_pipeline.connect(
        os.environ.get("AENV_NATS_URL", "nats://127.0.0.1:4222"),
        team=os.environ.get("AENV_PIPELINE_TEAM", "default"),
        prefix=os.environ.get("AENV_BUS_PREFIX", ""),
        scoped=user is not None,
        user=user,
        password=os.environ.get("AENV_NATS_PASSWORD"),
    )
    async with p:
        gate = asyncio.Semaphore(CONCURRENCY)
        made = await asyncio.gather(*(create(p, gate, run, i) for i in range(n)))
        rollout = made[0][0]
        # ... the rollout's episode would run here (e2b SDK: Sandbox.connect(rollout)) ...
        running = await audit(p, rollout)
        for sandbox_id, _ in made:
            await p.kill(sandbox_id)
        killed = await audit(p, rollout)
        history = [
            {"seq": e.seq, "type": e.type, "at": e.time.isoformat()}
            async for e in p.replay(sandbox=rollout)
        ]
        run_events = [e async for e in p.replay(metadata={"run": run})]
    return {
        "run": run,
        "sandboxes": [s for s, _ in made],
        "create_s": [t for _, t in made],
        "rollout": rollout,
        "history": history,
        "run_events": len(run_events),
        "audit_running": running,
        "audit_killed": killed,
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 4))))
