"""What `/health/ready` checks: each dependency the API needs to do its job, probed with a
short timeout, and the verdict a pure function of the probes' answers.

Before, `/health` answered 200 "ok" whenever the NATS client was connected, with Postgres
or S3 dead: a load balancer kept sending traffic that could only fail. A probe that does
not answer within `TIMEOUT_S` counts as down (a stopped server hangs, it does not refuse).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping

import httpx
from sqlalchemy import text

from api.context import ApiContext
from bus.nodes import describe_uploads, is_gone

#: Per probe; every probe runs at once, so a check answers within about this long.
TIMEOUT_S = 2.0

#: None: up; otherwise why it is down, in a few words.
Probe = Callable[[], Awaitable[str | None]]


def verdict(results: Mapping[str, str | None]) -> tuple[int, str]:
    """200 with "ok" when every check passed, else 503 with what is down."""
    down = [f"{name}: {why}" for name, why in sorted(results.items()) if why is not None]
    if not down:
        return 200, "ok"
    return 503, "not ready: " + "; ".join(down)


async def run(probes: Mapping[str, Probe], timeout: float = TIMEOUT_S) -> dict[str, str | None]:
    async def one(probe: Probe) -> str | None:
        try:
            return await asyncio.wait_for(probe(), timeout)
        except TimeoutError:
            return f"no answer within {timeout:g}s"
        except Exception as e:  # a probe's failure is its answer
            return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"

    names = list(probes)
    answers = await asyncio.gather(*(one(probes[n]) for n in names))
    return dict(zip(names, answers, strict=True))


def _beating(ctx: ApiContext) -> bool:
    now = time.time()
    return ctx.nodes is None or any(not is_gone(b, now) for b in ctx.nodes.beats.values())


def probes(ctx: ApiContext) -> dict[str, Probe]:
    """The API's dependencies: the bus, the read models, the snapshot store when the
    stack has one, and at least one node beating — unless `AENV_READY_NEEDS_NODE=0` (a
    fleet's APIs: a load balancer must not take every API out because no node beats; that
    is a warning there)."""

    async def nats() -> str | None:
        if not ctx.bus.nc.is_connected:
            return "disconnected"
        await ctx.bus.nc.flush(timeout=int(TIMEOUT_S))  # a round trip, not a flag
        return None

    async def postgres() -> str | None:
        async with ctx.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
        return None

    async def s3() -> str | None:
        assert ctx.settings.s3_endpoint is not None
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
            r = await client.get(ctx.settings.s3_endpoint)
        # unsigned: 403 (or 200 on a public gateway) means it answers S3; 5xx means its
        # backend (SeaweedFS's filer, volumes) is not there
        return None if r.status_code < 500 else f"answers {r.status_code}"

    async def node() -> str | None:
        return None if _beating(ctx) else "no node is beating"

    out: dict[str, Probe] = {"nats": nats, "postgres": postgres}
    if ctx.settings.ready_needs_node:
        out["node"] = node
    if ctx.settings.s3_endpoint:
        out["s3"] = s3
    return out


def warnings(ctx: ApiContext) -> dict[str, str]:
    """What is at risk without stopping the API from serving, so readiness stays 200 but
    says it: pauses not yet durable because their upload keeps failing (S3 down), from the
    nodes' heartbeats. `aenv status` counts these as problems."""
    if ctx.nodes is None:
        return {}
    now = time.time()
    late = [
        f"{describe_uploads(b.uploads_waiting, b.oldest_upload_wait_s)} on node {b.node_id}"
        for b in ctx.nodes.beats.values()
        if b.uploads_waiting and not is_gone(b, now)
    ]
    out = {"uploads": "; ".join(late)} if late else {}
    if not ctx.settings.ready_needs_node and not _beating(ctx):
        out["node"] = "no node is beating: creates are refused until one is"
    return out
