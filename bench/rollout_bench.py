"""Rollout benchmark (issue 32): the loop an RL trainer runs, through the unchanged `e2b`
SDK (`AsyncSandbox`), against a stack `aenv up` starts for the run (the machine's NATS at
127.0.0.1:4222 in a private bus namespace, a scratch Postgres database; both removed at
the end). Limits of admission control stay off (their default).

An episode: `AsyncSandbox.create`, `--commands` short commands (`echo i`), a file write
and its read back, `kill`. `--concurrency` episodes run at once until `--episodes` are done.
Reported: episodes/s, each step's latency (p50/p99), failures by step with their error text,
the most sandboxes alive at once (on real VMs: how many fit), and the load on this machine
(the load generator shares its 2 cores with the stack: a saturated host is said, not hidden).

- `--host qemu` (root; run under `flock /tmp/aenv-vm.lock`): real VMs. Each episode also
  runs the same commands, write and read straight to the guest's envd (its address from the
  routes bucket, the SDK's own client, no API and no node proxy): the `raw_*` steps, and
  per step the overhead SDK → API → node proxy → envd adds (`shift`, Hodges-Lehmann).
- `--host memory`: the VM-less stack (`AENV_NODE_HOST=memory`: the whole control plane,
  nodes keep sandboxes as records). A memory sandbox has no guest, so an episode there is
  create and kill; the command and file steps are listed as not run. Then the lease phase:
  `--lease-sandboxes` sandboxes created under one lease (`aenv.lease`, docs/leases.md),
  renewed while they are created, then left to expire; measured from the lease's deadline
  until the bulk list of the lease's metadata shows none.

Run: `python -m bench.rollout_bench --host memory [--concurrency 1024]` or
`flock /tmp/aenv-vm.lock python -m bench.rollout_bench --host qemu [--concurrency 16]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from aenv.stack.process import free_port
from bench.fleet_sim import host_busy_s
from bench.scratch import NATS_URL, PG, create_database, delete_namespace, drop_database
from bench.stackup import AENV, aenv_up
from bench.stats import emit, shift, summary
from shared.proxy.ingress import ENVD_PORT

SDK_ENV = ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY")
#: The steps of an episode, in order; `raw_*` are the same calls straight to envd.
STEPS = ("create", "command", "write", "read", "kill")
RAW = ("command", "write", "read")
#: A host this busy (share of all its cores) is the load generator's limit, not the stack's.
SATURATED = 0.9
#: The memory host's room: one node big enough for every sandbox of both phases.
MEMORY_CAPACITY = 2400


# ---- pure helpers ----------------------------------------------------------------------
#: What differs between two sandboxes' otherwise equal errors: addresses, sandbox ids.
_VARIES = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b|\b[a-z0-9]{20}\b")


def first_line(error: BaseException) -> str:
    """An error as one line: its type and the first line of its text, 200 chars at most,
    guest addresses and sandbox ids masked so that equal failures group together."""
    text = str(error).strip().splitlines()
    return _VARIES.sub("*", f"{type(error).__name__}: {text[0] if text else ''}")[:200]


def envd_url(address: str) -> str:
    """The guest's envd from a route's address (a bare IP means envd's own port)."""
    return f"http://{address}" if ":" in address else f"http://{address}:{ENVD_PORT}"


def failure_digest(failures: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """(step, error line) pairs grouped, commonest first: what failed, where, how often."""
    counts = Counter(failures)
    return [
        {"step": step, "error": error, "count": n}
        for (step, error), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    ]


def rate(count: int, seconds: float) -> float | None:
    """count / seconds, rounded; None for no time at all."""
    return round(count / seconds, 1) if seconds > 0 else None


def saturation(busy_s: float, wall_s: float, cpus: int) -> dict[str, Any]:
    """How busy the whole machine was over `wall_s` (busy CPU seconds over all cores)."""
    share = busy_s / (wall_s * cpus) if wall_s > 0 and cpus > 0 else 0.0
    return {"host_busy_share": round(share, 3), "saturated": share >= SATURATED}


def overhead(samples: dict[str, list[float]]) -> dict[str, float | None]:
    """Per step that also ran straight to envd: how much longer it took through the stack."""
    return {s: shift(samples[s], samples[f"raw_{s}"]) for s in RAW if samples.get(f"raw_{s}")}


# ---- the stack -------------------------------------------------------------------------
@contextlib.contextmanager
def stack(data: Path, host: str) -> Iterator[dict[str, str]]:
    """`aenv up` on `data` with its own database and bus namespace; its exports; `aenv down`."""
    token = secrets.token_hex(4)
    db, prefix = f"aenv_bench_{token}", f"b{token}"
    asyncio.run(create_database(db))
    env = {
        **os.environ,
        "AENV_NATS_URL": NATS_URL,
        "AENV_BUS_PREFIX": prefix,
        "AENV_DATABASE_URL": f"{PG}/{db}",
        "AENV_NODE_ID": "rollout",
        "AENV_TLS_PORT": str(free_port()),
    }
    if host == "memory":
        env |= {
            "AENV_NODE_HOST": "memory",
            "AENV_EMBEDDED_S3": "0",
            "AENV_CAPACITY": str(MEMORY_CAPACITY),
            "AENV_MEMORY_MIB": str(MEMORY_CAPACITY * 512),
            "AENV_VCPUS": str(MEMORY_CAPACITY),
        }
    else:
        env |= {"AENV_SLOT_PREFIX": "aenvro"}
    for k in (*SDK_ENV, "E2B_VOLUME_API_URL"):
        env.pop(k, None)
    try:
        exports = aenv_up(data, env, timeout=900)
        os.environ.update({k: exports[k] for k in SDK_ENV})
        try:
            yield {**exports, "AENV_NATS_URL": NATS_URL, "AENV_BUS_PREFIX": prefix}
        finally:
            subprocess.run(
                [*AENV, "down", "--data-dir", str(data)], capture_output=True, timeout=120, env=env
            )
    finally:
        asyncio.run(drop_database(db))
        asyncio.run(delete_namespace(prefix))


# ---- the rollout loop ------------------------------------------------------------------
@dataclass
class Run:
    """What one pass of episodes measured: each step's times, the failures, how many
    sandboxes were alive at once."""

    samples: dict[str, list[float]] = field(default_factory=dict)
    failures: list[tuple[str, str]] = field(default_factory=list)
    ok: int = 0
    live: int = 0
    peak_live: int = 0

    def time(self, step: str, seconds: float) -> None:
        self.samples.setdefault(step, []).append(seconds)


class Episode:
    """One episode's steps, each timed; a failed step ends the episode (the sandbox, if any,
    is still killed, untimed)."""

    def __init__(self, run: Run, args: argparse.Namespace, routes: Any) -> None:
        self.run, self.args, self.routes = run, args, routes
        self.step = "create"

    async def timed(self, step: str, call: Any) -> Any:
        self.step = step
        t = time.perf_counter()
        try:
            out = await call
        except Exception:  # how long a refusal took matters too (a 503 at once, or a timeout)
            self.run.time(f"{step}_failed", time.perf_counter() - t)
            raise
        self.run.time(step, time.perf_counter() - t)
        return out

    async def play(self) -> None:
        from e2b import AsyncSandbox

        sbx = None
        try:
            sbx = await self.timed(
                "create", AsyncSandbox.create(metadata={"bench": "rollout"}, timeout=600)
            )
            self.run.live += 1
            self.run.peak_live = max(self.run.peak_live, self.run.live)
            if self.args.host == "qemu":
                await self.steps(sbx, "")
                await self.steps(await self.raw(sbx), "raw_")
            await self.timed("kill", sbx.kill())
            sbx = None
            self.run.live -= 1
            self.run.ok += 1
        except Exception as e:
            self.run.failures.append((self.step, first_line(e)))
            if sbx is not None:
                self.run.live -= 1
                with contextlib.suppress(Exception):
                    await sbx.kill()

    async def steps(self, sbx: Any, raw: str) -> None:
        path = f"/tmp/rollout-{raw or 'api'}.txt"
        for n in range(self.args.commands):
            result = await self.timed(f"{raw}command", sbx.commands.run(f"echo {n}"))
            if result.stdout.strip() != str(n):
                raise RuntimeError(f"echo {n} printed {result.stdout!r}")
        payload = secrets.token_hex(512)
        await self.timed(f"{raw}write", sbx.files.write(path, payload))
        back = await self.timed(f"{raw}read", sbx.files.read(path))
        if back != payload:
            raise RuntimeError("read back differs from what was written")

    async def raw(self, sbx: Any) -> Any:
        """The same sandbox's envd, straight at the guest's address (no API, no proxy)."""
        from e2b import AsyncSandbox
        from e2b.connection_config import ConnectionConfig

        self.step = "raw_route"
        route = await self.routes.get(sbx.sandbox_id)
        if route is None:
            raise RuntimeError(f"no route for {sbx.sandbox_id}")
        token = sbx._envd_access_token
        headers = {"X-Access-Token": token} if token else {}  # what the SDK's create adds
        return AsyncSandbox(
            sandbox_id=sbx.sandbox_id,
            sandbox_domain=None,
            envd_version=sbx._envd_version,
            envd_access_token=token,
            traffic_access_token=None,
            connection_config=ConnectionConfig(
                sandbox_url=envd_url(route.address),
                api_key="unused",
                extra_sandbox_headers=headers,
            ),
        )


async def rollouts(args: argparse.Namespace, info: dict[str, str]) -> dict[str, Any]:
    from bus import Bus, BusSettings
    from bus.routes import RouteBook

    settings = BusSettings(nats_url=NATS_URL, bus_prefix=info["AENV_BUS_PREFIX"])
    bus = await Bus.connect(settings, name="rollout-bench", setup=False)
    try:
        routes = await RouteBook.open(bus.js, bus.names.routes_bucket)
        warm = Run()  # the SDK's connections, the stack's caches
        await asyncio.gather(*(Episode(warm, args, routes).play() for _ in range(2)))
        run, todo = Run(), iter(range(args.episodes))

        async def worker() -> None:
            for _ in todo:
                await Episode(run, args, routes).play()

        busy0, cpu0 = host_busy_s(), os.times()
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        wall = time.perf_counter() - t0
        cpu1 = os.times()
        load_gen = (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / wall
    finally:
        await bus.close()
    return {
        "concurrency": args.concurrency,
        "episodes": args.episodes,
        "episodes_ok": run.ok,
        "seconds": round(wall, 3),
        "episodes_per_s": rate(run.ok, wall),
        "peak_sandboxes_alive": run.peak_live,
        "steps": {k: summary(v) for k, v in sorted(run.samples.items())},
        "commands_per_episode": args.commands if args.host == "qemu" else 0,
        "not_run": None
        if args.host == "qemu"
        else {"steps": list(STEPS[1:4]), "why": "a memory-host sandbox has no guest (no envd)"},
        "overhead_vs_raw_envd_ms": overhead(run.samples),
        "failures": failure_digest(run.failures),
        "warmup_failures": failure_digest(warm.failures),
        "load": {
            **saturation(host_busy_s() - busy0, wall, os.cpu_count() or 1),
            "load_generator_cores": round(load_gen, 3),
        },
    }


# ---- leases: expiry of a whole job ----------------------------------------------------
async def lease_cleanup(args: argparse.Namespace, info: dict[str, str]) -> dict[str, Any]:
    import httpx

    n, ttl = args.lease_sandboxes, args.lease_ttl
    async with httpx.AsyncClient(
        base_url=info["E2B_API_URL"],
        headers={"X-API-KEY": info["E2B_API_KEY"]},
        timeout=120,
        limits=httpx.Limits(max_connections=args.lease_concurrency),
    ) as api:
        r = await api.post("/leases", json={"ttl": ttl})
        r.raise_for_status()
        lease = r.json()["leaseID"]
        meta = {"aenv.lease": lease}
        created, errors = 0, Counter[str]()
        gate = asyncio.Semaphore(args.lease_concurrency)

        async def create() -> None:
            nonlocal created
            async with gate:
                r = await api.post("/sandboxes", json={"templateID": "base", "metadata": meta})
            if r.status_code == 201:
                created += 1
            else:
                errors[f"{r.status_code}: {r.text[:160]}"] += 1

        async def renew(stop: asyncio.Event) -> None:
            while not stop.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), ttl / 3)
                (await api.post(f"/leases/{lease}/renew")).raise_for_status()

        stop = asyncio.Event()
        renewer = asyncio.create_task(renew(stop))
        t = time.perf_counter()
        await asyncio.gather(*(create() for _ in range(n)))
        create_s = time.perf_counter() - t
        stop.set()
        await renewer  # its last renewal: the deadline is ttl from then
        listed = await _listed(api, meta)
        expires = datetime.fromisoformat((await api.get(f"/leases/{lease}")).json()["expiresAt"])
        left_at: list[tuple[float, int]] = []
        while True:
            count = await _listed(api, meta)
            now = time.time()
            left_at.append((now, count))
            if count == 0 or now - expires.timestamp() > args.lease_wait:
                break
            await asyncio.sleep(0.1)
        after_deadline = left_at[-1][0] - expires.timestamp()
        first_gone = next((t for t, c in left_at if c < listed), None)
        state = (await api.get(f"/leases/{lease}")).json()["state"]
    return {
        "sandboxes": n,
        "created": created,
        "create_errors": dict(errors),
        "create_seconds": round(create_s, 3),
        "listed_before_expiry": listed,
        "ttl_s": ttl,
        "left_at_end": left_at[-1][1],
        "lease_state": state,
        "first_kill_after_deadline_s": None
        if first_gone is None
        else round(first_gone - expires.timestamp(), 3),
        "all_gone_after_deadline_s": round(after_deadline, 3),
        "kills_per_s": rate(listed, after_deadline),
        "note": "from the lease's expiresAt (its last renewal + ttl) until POST "
        "/sandboxes/bulk/list of its metadata shows none (polled every 0.1 s)",
    }


async def _listed(api: Any, meta: dict[str, str]) -> int:
    r = await api.post("/sandboxes/bulk/list", json={"metadata": meta})
    r.raise_for_status()
    return int(r.json()["count"])


def main(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="aenv-rollout-"))
    try:
        with stack(root / "data", args.host) as info:
            doc: dict[str, Any] = {
                "host_kind": args.host,
                "sdk": "e2b AsyncSandbox (unchanged), one process, one event loop",
                "admission_limits": "off (the default)",
                "rollouts": asyncio.run(rollouts(args, info)),
            }
            if args.host == "memory" and args.lease_sandboxes:
                doc["lease_expiry"] = asyncio.run(lease_cleanup(args, info))
            return doc
    finally:
        shutil.rmtree(root, ignore_errors=True)


def cli() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--host", choices=("memory", "qemu"), default="memory")
    p.add_argument("--concurrency", type=int, help="episodes at once (memory 1024, qemu 16)")
    p.add_argument("--episodes", type=int, help="episodes in all (default 4 x concurrency)")
    p.add_argument("--commands", type=int, default=5, help="echo commands per episode")
    p.add_argument("--lease-sandboxes", type=int, default=1000, help="memory host; 0: skip")
    p.add_argument("--lease-ttl", type=int, default=10, help="the lease's TTL, seconds")
    p.add_argument("--lease-concurrency", type=int, default=64, help="creates at once")
    p.add_argument("--lease-wait", type=float, default=120, help="give up after (s)")
    args = p.parse_args()
    args.concurrency = args.concurrency or (1024 if args.host == "memory" else 16)
    args.episodes = args.episodes or 4 * args.concurrency
    doc = main(args)
    emit(f"rollout_bench_{args.host}", doc)
    if doc["rollouts"]["failures"]:
        print(json.dumps(doc["rollouts"]["failures"][:5]), file=sys.stderr)


if __name__ == "__main__":
    cli()
