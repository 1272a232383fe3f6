"""Fleet SIMULATOR: the control plane at scale, with simulated nodes that run no VMs.

Real: a 3-server NATS JetStream cluster (`bench/cluster.py`; streams and buckets at R3), a
scratch Postgres database, `--apis` API processes started as a fleet starts them
(`python -m aenv.cli serve --role api`, every connection from `AENV_*`: projectors, timer,
answers, route and heartbeat mirrors included) and, in every simulated node, the real
`NodeWorker`: its durable consumers `node-<id>` and the shared `place`, capacity ledger,
journal, routes and heartbeats. Simulated: the VM. A node's Host is a `SimulatedHost` (the
in-memory `MemoryHost` of the VM-less tier, plus a guest address nobody can reach, so the
node puts and drops its routes as a real node does). `--nodes` nodes are spread over
`--node-processes` processes, one NATS connection per process; node ids are `sim-NNNN`.
With `--snapshot-workers` each node also runs the real snapshot worker (its durable
`snapshot-<id>` over every sandbox event) with a repository that stores nothing.

This is a benchmark tool, never a stand-in on the tested path: no test of the real node uses
it (`tests/unit/bench/test_fleet_sim.py` checks its pure helpers only).

The load: `--lifecycles` E2B lifecycles over HTTP — `POST /v2/sandboxes`, `POST …/pause`,
`POST …/connect` (the resume), `DELETE …` — `--concurrency` in flight, each call to the next
API process (behind a load balancer a client's calls meet different APIs). A node does no VM
work (`--host-delay-ms` 0), so an API call's latency is the control plane's overhead: HTTP,
the command through NATS, the node's decisions and appends, the outcome back.

Reported (stdout, and `bench/results/fleet_sim.json`): commands/s and events/s; latency per
operation; errors by status; projection lag (the sandboxes projection's checkpoint behind the
log's last sequence, sampled each second, and the catch-up once the load stops); the shared
`place` queue (pending, in flight, waiting pulls); CPU in cores of NATS, Postgres (every
`postgres` process on the machine: it may serve others too), the APIs, the node processes and
this load generator, under load and with the fleet idle; RSS; placement skew; stream, KV and
consumer state from the servers' monitoring.

Run: `python -m bench.fleet_sim [--nodes 200] [--node-processes 4] [--apis 2]
[--lifecycles 20000] [--concurrency 64]` — the full size wants a quiet machine. Ctrl-C,
SIGTERM or SIGHUP stop it cleanly (processes, cluster, database `aenv_sim_*`, temp dir
`aenv-sim-*`); a SIGKILL leaves the NATS servers and the database behind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from nats.js.errors import NoKeysError

from aenv.eventloop import run as run_loop
from aenv.logformat import marks
from aenv.stack.process import die_with_parent, free_port
from bench.cluster import NatsCluster
from bench.stats import emit, summary
from bus import Bus, BusSettings, stream_last_seq
from bus.decisions import execute
from domain import template as tp
from envd.version import ENVD_VERSION
from workers.node.memory import MemoryHost
from workers.node.settings import NodeSettings
from workers.node.worker import NodeWorker
from workers.snapshot.worker import SnapshotWorker, TemplateSource

REPO = Path(__file__).resolve().parent.parent
PG = os.environ.get("AENV_BENCH_PG", "postgresql://postgres@127.0.0.1:5432")
#: The `base` template the simulator registers (a node role would): every create's size.
BASE_VCPUS, BASE_MEM_MIB = 1, 512
#: What a node process prints once all its simulated nodes pull commands.
NODES_READY = "SIM-NODES-READY"
ROLE_READY = "ROLE-READY"
#: The sandboxes projection: the one whose checkpoint the lag is measured on.
PROJECTION = "sandboxes"
OPS = ("create", "pause", "connect", "kill")
CLK_TCK = os.sysconf("SC_CLK_TCK")


class SimError(RuntimeError):
    """The simulated fleet could not be set up."""


# ---- pure helpers ----------------------------------------------------------------------
def node_id(index: int) -> str:
    """A simulated node's id: never mistaken for a real one."""
    return f"sim-{index:04d}"


def split_fleet(nodes: int, processes: int) -> list[tuple[int, int]]:
    """(first node index, node count) of each node process, as even as they go."""
    processes = max(1, min(processes, nodes))
    base, extra = divmod(nodes, processes)
    out, first = [], 0
    for i in range(processes):
        count = base + (1 if i < extra else 0)
        out.append((first, count))
        first += count
    return out


def stat_cpu_s(stat: str, *, children: bool = False) -> float:
    """CPU seconds (user + system, all threads) of one `/proc/<pid>/stat` line; with
    `children`, plus those of its reaped children (a postmaster's ended backends)."""
    fields = stat.rsplit(")", 1)[1].split()  # the command name may hold spaces
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / CLK_TCK


def stat_comm(stat: str) -> str:
    return stat.split("(", 1)[1].rsplit(")", 1)[0]


def skew(per_node: dict[str, int], nodes: int) -> dict[str, Any]:
    """How evenly creates spread: counts per node (nodes that took none count as 0)."""
    counts = sorted(per_node.values()) + [0] * max(0, nodes - len(per_node))
    if not counts or not sum(counts):
        return {"nodes": nodes, "sandboxes": 0}
    mean = sum(counts) / len(counts)
    stdev = math.sqrt(sum((c - mean) ** 2 for c in counts) / len(counts))
    return {
        "nodes": nodes,
        "nodes_used": sum(1 for c in counts if c),
        "sandboxes": sum(counts),
        "min": min(counts),
        "max": max(counts),
        "mean": round(mean, 2),
        "max_over_mean": round(max(counts) / mean, 3),
        "stdev_over_mean": round(stdev / mean, 3),
    }


def cores(before: dict[str, float], after: dict[str, float], wall_s: float) -> dict[str, float]:
    """CPU seconds per group between two readings, divided by the wall time: cores used."""
    return {k: round((after[k] - before[k]) / wall_s, 3) for k in before if k in after}


# ---- /proc readings --------------------------------------------------------------------
def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def pid_cpu_s(pid: int) -> float:
    stat = _read(f"/proc/{pid}/stat")
    return stat_cpu_s(stat) if stat else 0.0


def postgres_cpu_s() -> float:
    """Every `postgres` process on the machine, with its reaped children: the postmaster's
    share holds the backends that ended meanwhile."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _read(f"/proc/{entry}/stat")
            if stat and stat_comm(stat) == "postgres":
                total += stat_cpu_s(stat, children=True)
    return total


def host_busy_s() -> float:
    """CPU seconds the whole machine spent busy (all cores, every process)."""
    stat = _read("/proc/stat") or "cpu 0 0 0 0 0 0 0 0"
    user, nice, system, _idle, _iowait, irq, softirq, steal = (
        int(x) for x in stat.splitlines()[0].split()[1:9]
    )
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def rss_mib(pid: int) -> float:
    for line in (_read(f"/proc/{pid}/status") or "").splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def cpu_reading(groups: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds so far of each group of pids, Postgres, this process and the machine."""
    me = os.times()
    out = {name: sum(pid_cpu_s(p) for p in pids) for name, pids in groups.items()}
    out["postgres_all"] = postgres_cpu_s()
    out["load_generator"] = me.user + me.system
    out["host_busy"] = host_busy_s()
    return out


# ---- the simulated node ----------------------------------------------------------------
@dataclass(frozen=True)
class SimCapture:
    """A paused record's capture as the snapshot worker sees it (there are no files)."""

    snapshot_id: str
    dir: Path
    base_image_digest: str = "simulated"
    size_bytes: int = 0
    volumes: tuple[tuple[int, str, Path], ...] = ()
    image_bytes: int = 0


class NoRepository:
    """A snapshot repository that stores nothing, at once."""

    async def upload(
        self, snapshot_dir: Path, *, base_image_digest: str, snapshot_id: str
    ) -> object:
        return None

    async def upload_volume(self, image: Path, *, key: str, volume_id: str) -> object:
        return None


class SimulatedHost(MemoryHost):
    """A simulated node's Host: `MemoryHost`'s records (no VM), plus a guest address in
    TEST-NET-1 that nothing can reach, so the worker puts a route beside every create and
    resume and drops it on pause and kill as a real node does (the routes bucket's load and
    every API's route mirror are real), and the snapshot worker's `LocalCaptures` port."""

    def __init__(
        self, *, capacity: int, delay_s: float, index: int, routes: bool, state_dir: Path
    ) -> None:
        super().__init__(capacity=capacity, delay_s=delay_s)
        self.address = f"192.0.2.{index % 254 + 1}:49983"
        self.routes = routes
        self.state_dir = state_dir

    def upstream(self, sandbox_id: str) -> str | None:
        return self.address if self.routes and self.runs(sandbox_id) else None

    async def paused_capture(self, sandbox_id: str, snapshot_id: str) -> SimCapture | None:
        box = self.paused.get(sandbox_id)
        if box is None or box.capture != snapshot_id:
            return None
        return SimCapture(snapshot_id, self.state_dir)

    def template_capture(self, name: str) -> SimCapture | None:
        return None

    def template_uploaded(self, name: str, snapshot_id: str) -> TemplateSource | None:
        return None


class SimulatedNode:
    """One simulated node: the real `NodeWorker` (and, if asked, snapshot worker) over a
    `SimulatedHost`, with settings of its own, on its process's shared bus connection."""

    def __init__(self, bus: Bus, index: int, root: Path, args: argparse.Namespace) -> None:
        capacity = args.node_capacity
        state = root / "nodes" / node_id(index)
        # room: `capacity` sandboxes of the base size bind before memory or vCPUs do
        self.settings = NodeSettings(
            node_id=node_id(index),
            node_host="memory",
            state_dir=state,
            capacity=capacity,
            memory_mib=capacity * BASE_MEM_MIB,
            vcpus=capacity * BASE_VCPUS,
            base_vcpus=BASE_VCPUS,
            base_mem_mib=BASE_MEM_MIB,
            heartbeat_s=args.heartbeat_s,
        )
        self.host = SimulatedHost(
            capacity=capacity,
            delay_s=args.host_delay_ms / 1000,
            index=index,
            routes=args.routes,
            state_dir=state,
        )
        self.uploads = (
            SnapshotWorker(bus, self.settings.node_id, self.host, NoRepository())
            if args.snapshot_workers
            else None
        )
        self.worker = NodeWorker(
            bus,
            self.host,
            self.settings,
            node_proxy=None,
            on_moot=self.uploads.cancel if self.uploads else None,
            uploads_waiting=self.uploads.waiting if self.uploads else None,
        )

    async def start(self) -> None:
        await self.worker.start()
        if self.uploads is not None:
            await self.uploads.start()

    async def stop(self) -> None:
        if self.uploads is not None:
            await self.uploads.stop()
        await self.worker.stop()
        await self.host.close()


async def serve_nodes(args: argparse.Namespace) -> None:
    """A node process: `--serve-nodes FIRST COUNT` simulated nodes on one bus connection,
    until SIGTERM."""
    first, count = args.serve_nodes
    bus = await Bus.connect(BusSettings(), name=f"aenv-sim-nodes-{first}", setup=False)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    nodes = [SimulatedNode(bus, i, Path(args.root), args) for i in range(first, first + count)]
    gate = asyncio.Semaphore(8)  # each start creates two R3 consumers: not all at once

    async def start(node: SimulatedNode) -> None:
        async with gate:
            await node.start()

    try:
        t = time.perf_counter()
        await asyncio.gather(*(start(n) for n in nodes))
        print(
            f"{count} simulated nodes from {node_id(first)} started in "
            f"{time.perf_counter() - t:.1f} s",
            flush=True,
        )
        print(NODES_READY, flush=True)
        await stop.wait()
    finally:
        await asyncio.gather(*(n.stop() for n in nodes), return_exceptions=True)
        await bus.close()


# ---- processes -------------------------------------------------------------------------
@dataclass
class Child:
    """A process of the simulated fleet (an API, a node process), its output in a log."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            # its own session: a Ctrl-C reaches us, and we stop it in order
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent(os.getpid()),
            )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def wait_for(self, line: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise SimError(f"{self.name} exited ({self.proc.returncode}):\n{self.tail()}")
            text = self.log.read_text(errors="replace") if self.log.exists() else ""
            if any(marks(ln, line) for ln in text.splitlines()):
                return
            await asyncio.sleep(0.2)
        raise SimError(f"{self.name} not ready after {timeout:.0f} s:\n{self.tail()}")

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()

    def reap(self, deadline: float) -> None:
        if self.proc is None:
            return
        try:
            self.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def tail(self, n: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-n:])


def _admission_env(args: argparse.Namespace) -> dict[str, str]:
    """`--admission`: both of a team's limits checked on every create (`api/admission.py`),
    set so high that none is refused — what admission control costs a create."""
    if not args.admission:
        return {}
    return {"AENV_TEAM_MAX_SANDBOXES": "1000000", "AENV_TEAM_CREATES_PER_S": "1000000"}


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("AENV_", "E2B_"))}


# ---- the load --------------------------------------------------------------------------
@dataclass
class Tally:
    latencies: dict[str, list[float]] = field(default_factory=lambda: {op: [] for op in OPS})
    errors: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    lifecycles_ok: int = 0
    ops: int = 0


async def _call(
    tally: Tally, op: str, request: Awaitable[httpx.Response], ok: int
) -> httpx.Response | None:
    t = time.perf_counter()
    try:
        r = await request
    except httpx.HTTPError as e:
        key = f"{op}:{type(e).__name__}"
        tally.errors[key] += 1
        tally.examples.setdefault(key, str(e)[:300])
        return None
    tally.ops += 1
    if r.status_code == ok:
        tally.latencies[op].append(time.perf_counter() - t)
        return r
    key = f"{op}:{r.status_code}"
    tally.errors[key] += 1
    tally.examples.setdefault(key, r.text[:300])
    return None


async def lifecycle(
    clients: list[httpx.AsyncClient], i: int, tally: Tally, *, creates_only: bool = False
) -> bool:
    """One sandbox's life: create, pause, connect (resume), kill — each call to the next API
    (`creates_only`: create, kill)."""

    def api(k: int) -> httpx.AsyncClient:
        return clients[(i + k) % len(clients)]

    body = {"templateID": "base", "timeout": 300}
    created = await _call(tally, "create", api(0).post("/v2/sandboxes", json=body), 201)
    if created is None:
        return False
    sid = created.json()["sandboxID"]
    if creates_only:  # the sustained create rate: create and kill, nothing between
        gone = await _call(tally, "kill", api(1).delete(f"/sandboxes/{sid}"), 204) is not None
        tally.lifecycles_ok += gone
        return gone
    ok = await _call(tally, "pause", api(1).post(f"/sandboxes/{sid}/pause"), 204) is not None
    if ok:
        resume = api(2).post(f"/sandboxes/{sid}/connect", json={"timeout": 300})
        ok = await _call(tally, "connect", resume, 201) is not None
    killed = await _call(tally, "kill", api(3).delete(f"/sandboxes/{sid}"), 204) is not None
    if ok and killed:
        tally.lifecycles_ok += 1
    return ok and killed


async def run_load(
    clients: list[httpx.AsyncClient],
    indices: Iterator[int],
    concurrency: int,
    tally: Tally,
    *,
    creates_only: bool = False,
) -> None:
    async def worker() -> None:
        for i in indices:  # shared: each index is taken by one worker
            await lifecycle(clients, i, tally, creates_only=creates_only)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


@dataclass
class Samples:
    """What the sampler saw each second during the load."""

    lag: list[float] = field(default_factory=list)
    place_pending: list[float] = field(default_factory=list)
    place_in_flight: list[float] = field(default_factory=list)
    place_waiting_pulls: list[float] = field(default_factory=list)
    #: one node's snapshot worker (`--snapshot-workers`): events it has yet to settle
    snapshot_backlog_one_node: list[float] = field(default_factory=list)
    failures: int = 0


async def _checkpoint(pg: Any) -> int:
    seq = await pg.fetchval("SELECT seq FROM projection_checkpoints WHERE name = $1", PROJECTION)
    return int(seq or 0)


async def sample(bus: Bus, pg: Any, stop: asyncio.Event, out: Samples, snapshots: bool) -> None:
    while not stop.is_set():
        try:
            last = await stream_last_seq(bus.js, bus.settings)
            out.lag.append(max(0, last - await _checkpoint(pg)))
            info = await bus.js.consumer_info(bus.names.command_stream, bus.names.place_consumer)
            out.place_pending.append(info.num_pending or 0)
            out.place_in_flight.append(info.num_ack_pending or 0)
            out.place_waiting_pulls.append(info.num_waiting or 0)
            if snapshots:
                info = await bus.js.consumer_info(
                    bus.names.event_stream, bus.names.snapshot_consumer(node_id(0))
                )
                out.snapshot_backlog_one_node.append(
                    (info.num_pending or 0) + (info.num_ack_pending or 0)
                )
        except Exception:  # a sample lost is no reason to stop the run
            out.failures += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


async def progress(tally: Tally, total: int, samples: Samples, stop: asyncio.Event) -> None:
    t0 = time.perf_counter()
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 10.0)
        s = time.perf_counter() - t0
        lag = int(samples.lag[-1]) if samples.lag else "?"
        print(
            f"fleet_sim: {tally.lifecycles_ok}/{total} lifecycles, {tally.ops / s:.0f} ops/s, "
            f"{sum(tally.errors.values())} errors, projection lag {lag} events",
            file=sys.stderr,
            flush=True,
        )


# ---- set-up and report -----------------------------------------------------------------
async def _wait_beats(bus: Bus, nodes: int, timeout: float) -> None:
    """Until every simulated node's heartbeat is in the nodes bucket."""
    kv = await bus.js.key_value(bus.names.nodes_bucket)
    wanted = {node_id(i) for i in range(nodes)}
    deadline = time.monotonic() + timeout
    seen: set[str] = set()
    while time.monotonic() < deadline:
        with contextlib.suppress(NoKeysError):
            seen = set(await kv.keys()) & wanted
        if len(seen) == nodes:
            return
        await asyncio.sleep(0.5)
    raise SimError(f"only {len(seen)} of {nodes} simulated nodes beat after {timeout:.0f} s")


async def snapshot_backlog(bus: Bus, nodes: int) -> dict[str, int]:
    """What the nodes' snapshot workers have yet to see: each one's durable gets every
    sandbox event (summed and worst over the fleet)."""
    pending, in_flight, worst = 0, 0, 0
    for i in range(nodes):
        info = await bus.js.consumer_info(
            bus.names.event_stream, bus.names.snapshot_consumer(node_id(i))
        )
        n = (info.num_pending or 0) + (info.num_ack_pending or 0)
        pending += info.num_pending or 0
        in_flight += info.num_ack_pending or 0
        worst = max(worst, n)
    return {"pending": pending, "in_flight": in_flight, "worst_node": worst}


async def _drain_snapshot_workers(bus: Bus, nodes: int, timeout: float) -> dict[str, Any]:
    """Until every snapshot worker has settled every event (or `timeout`): how long."""
    t = time.perf_counter()
    at_start = left = await snapshot_backlog(bus, nodes)
    while left["worst_node"] and time.perf_counter() - t < timeout:
        await asyncio.sleep(0.5)
        left = await snapshot_backlog(bus, nodes)
    return {
        "backlog_when_load_ended": at_start,
        "left": left,
        "drain_s": round(time.perf_counter() - t, 2),
    }


async def _first_lifecycles(clients: list[httpx.AsyncClient], timeout: float) -> None:
    """One whole lifecycle through each API (the templates projection may still be filling
    when the APIs say ready: a create then answers 404 for a moment)."""
    for k in range(len(clients)):
        deadline = time.monotonic() + timeout
        while not await lifecycle(clients, k, tally := Tally()):
            if time.monotonic() > deadline:
                raise SimError(f"no lifecycle through API {k} succeeded: {tally.examples}")
            await asyncio.sleep(0.5)


async def _monitoring(cluster: NatsCluster, bus: Bus) -> dict[str, Any]:
    """The servers' own view: per server CPU, memory, subscriptions and the JetStream assets
    it holds (R3 durables are on every server, R1 ordered consumers on one); per stream,
    the leader's state (messages, consumers) and its subject count."""
    servers = []
    subjects: dict[str, dict[str, Any]] = {}
    for s in cluster.servers:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            v = httpx.get(f"http://127.0.0.1:{s.monitor}/varz", timeout=5).json()
            j = httpx.get(
                f"http://127.0.0.1:{s.monitor}/jsz", params={"streams": "true"}, timeout=10
            ).json()
            servers.append(
                {
                    **{
                        k: v.get(k)
                        for k in (
                            "server_name",
                            "cpu",
                            "connections",
                            "subscriptions",
                            "slow_consumers",
                        )
                    },
                    "mem_mib": round((v.get("mem") or 0) / 2**20, 1),
                    "js_streams": j.get("streams"),
                    "js_consumers": j.get("consumers"),
                    "js_storage_mib": round((j.get("storage") or 0) / 2**20, 1),
                    "js_api_total": (j.get("api") or {}).get("total"),
                    "js_api_errors": (j.get("api") or {}).get("errors"),
                }
            )
            for acc in j.get("account_details", []):
                for st in acc.get("stream_detail", []):
                    state = st.get("state", {})
                    subjects.setdefault(
                        st["name"],
                        {
                            "num_subjects": state.get("num_subjects", 0),
                            "num_deleted": state.get("num_deleted", 0),
                        },
                    )
    streams = {}
    for name in subjects:
        with contextlib.suppress(Exception):
            info = await bus.js.stream_info(name)
            streams[name] = {
                "messages": info.state.messages,
                "bytes": info.state.bytes,
                "consumers": info.state.consumer_count,
                **subjects[name],
            }
    return {"servers": servers, "streams": streams}


async def _report_db(pg: Any, nodes: int) -> dict[str, Any]:
    rows = await pg.fetch(
        "SELECT node_id, count(*) AS n FROM sandboxes WHERE node_id IS NOT NULL GROUP BY node_id"
    )
    statuses = await pg.fetch("SELECT status, count(*) AS n FROM sandboxes GROUP BY status")
    return {
        "placement": skew({r["node_id"]: int(r["n"]) for r in rows}, nodes),
        "sandboxes_by_status": {str(r["status"]): int(r["n"]) for r in statuses},
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="aenv-sim-"))
    db = f"aenv_sim_{secrets.token_hex(4)}"
    cluster = NatsCluster(root / "nats")
    children: list[Child] = []
    clients: list[httpx.AsyncClient] = []
    admin: Any = None
    pg: Any = None
    bus: Bus | None = None
    me = asyncio.current_task()
    assert me is not None
    for sig in (signal.SIGTERM, signal.SIGHUP):  # as Ctrl-C (asyncio.run's): clean up, exit
        asyncio.get_running_loop().add_signal_handler(sig, me.cancel)
    try:
        cluster.start()
        await asyncio.to_thread(cluster.wait_healthy)
        admin = await asyncpg.connect(f"{args.pg}/postgres")
        await admin.execute(f'CREATE DATABASE "{db}"')
        db_url = f"postgresql+asyncpg://{args.pg.split('://', 1)[1]}/{db}"
        bus = await Bus.connect(BusSettings(nats_url=cluster.url, replicas=3), name="aenv-sim")
        # what a node role does at start; here once for the whole simulated fleet
        await execute(
            bus.templates,
            tp.RegisterTemplate(
                template_id="base",
                alias="base",
                envd_version=ENVD_VERSION,
                cpu_count=BASE_VCPUS,
                memory_mb=BASE_MEM_MIB,
                disk_size_mb=2048,
            ),
        )
        api_key, upload_secret = "e2b_" + secrets.token_hex(20), secrets.token_hex(16)
        common = {
            **_base_env(),
            "AENV_NATS_URL": cluster.url,
            "AENV_REPLICAS": "3",
            "AENV_DRAIN_S": "10",
        }
        ports = []
        for i in range(args.apis):
            port = free_port()
            ports.append(port)
            env = {
                **common,
                "AENV_DATABASE_URL": db_url,
                "AENV_HOST": "127.0.0.1",
                "AENV_PORT": str(port),
                "AENV_API_KEY": api_key,
                "AENV_UPLOAD_SECRET": upload_secret,
                "AENV_PROXY_VIA_NODE": "1",
                **_admission_env(args),
            }
            children.append(
                Child(
                    f"api-{i}",
                    [
                        sys.executable,
                        "-m",
                        "aenv.cli",
                        "serve",
                        "--role",
                        "api",
                        "--data-dir",
                        str(root / f"api-{i}"),
                    ],
                    env,
                    root / f"api-{i}.log",
                )
            )
        n_apis = len(children)
        for first, count in split_fleet(args.nodes, args.node_processes):
            argv = [
                sys.executable,
                "-m",
                "bench.fleet_sim",
                "--serve-nodes",
                str(first),
                str(count),
                "--root",
                str(root),
                *_node_flags(args),
            ]
            children.append(
                Child(f"nodes-{first}", argv, dict(common), root / f"nodes-{first}.log")
            )
        t = time.perf_counter()
        # every process at once, as a fleet's machines start (the APIs migrate one at a time)
        apis, nodes = children[:n_apis], children[n_apis:]
        for c in children:
            c.start()
        await asyncio.gather(
            *(c.wait_for(ROLE_READY, 600) for c in apis),
            *(c.wait_for(NODES_READY, 600) for c in nodes),
        )
        await _wait_beats(bus, args.nodes, 120)
        fleet_start_s = time.perf_counter() - t
        print(
            f"fleet_sim: {args.nodes} simulated nodes in {len(children) - n_apis} processes "
            f"and {n_apis} APIs ready in {fleet_start_s:.1f} s",
            file=sys.stderr,
        )

        pg = await asyncpg.connect(f"{args.pg}/{db}")
        limits = httpx.Limits(
            max_connections=args.concurrency, max_keepalive_connections=args.concurrency
        )
        clients = [
            httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{p}",
                limits=limits,
                headers={"X-API-KEY": api_key},
                timeout=180,
            )
            for p in ports
        ]
        await _first_lifecycles(clients, 60)
        warm = Tally()
        await run_load(clients, iter(range(args.warmup)), min(args.concurrency, 8), warm)

        groups = {
            "nats": [s.proc.pid for s in cluster.servers if s.proc is not None],
            "apis": [c.pid for c in children[:n_apis]],
            "node_processes": [c.pid for c in children[n_apis:]],
        }
        if args.snapshot_workers:  # the warm-up's events, at every node, before "idle"
            await _drain_snapshot_workers(bus, args.nodes, 300)
        before = cpu_reading(groups)
        await asyncio.sleep(args.idle_s)
        idle = cores(before, cpu_reading(groups), args.idle_s)

        tally, samples, stop = Tally(), Samples(), asyncio.Event()
        seq0 = await stream_last_seq(bus.js, bus.settings)
        watchers = [
            asyncio.create_task(sample(bus, pg, stop, samples, args.snapshot_workers)),
            asyncio.create_task(progress(tally, args.lifecycles, samples, stop)),
        ]
        before = cpu_reading(groups)
        t0 = time.perf_counter()
        await run_load(
            clients,
            iter(range(args.lifecycles)),
            args.concurrency,
            tally,
            creates_only=args.creates_only,
        )
        wall = time.perf_counter() - t0
        under_load = cores(before, cpu_reading(groups), wall)
        seq1 = await stream_last_seq(bus.js, bus.settings)
        stop.set()
        await asyncio.gather(*watchers)

        t = time.perf_counter()
        while await _checkpoint(pg) < seq1 and time.perf_counter() - t < 600:
            await asyncio.sleep(0.01)
        catch_up_s = time.perf_counter() - t
        uploads = (
            await _drain_snapshot_workers(bus, args.nodes, 600) if args.snapshot_workers else None
        )
        checkpoint = await _checkpoint(pg)
        await asyncio.sleep(2)  # late route drops and heartbeats settle before the census
        place = await bus.js.consumer_info(bus.names.command_stream, bus.names.place_consumer)
        events = seq1 - seq0
        doc: dict[str, Any] = {
            "simulated": "nodes run no VMs (SimulatedHost): latencies are control-plane "
            "overhead only",
            "params": {k: v for k, v in vars(args).items() if k not in ("serve_nodes", "root")},
            "fleet": {
                "nodes": args.nodes,
                "node_processes": len(children) - n_apis,
                "apis": n_apis,
                "start_s": round(fleet_start_s, 2),
                "node_capacity": args.node_capacity,
            },
            "load": {
                "lifecycles": args.lifecycles,
                "lifecycles_ok": tally.lifecycles_ok,
                "seconds": round(wall, 3),
                "lifecycles_per_s": round(tally.lifecycles_ok / wall, 1),
                "commands_per_s": round(tally.ops / wall, 1),
                "creates_per_s": round(len(tally.latencies["create"]) / wall, 1),
                "events": events,
                "events_per_s": round(events / wall, 1),
                "events_per_lifecycle": round(events / max(1, args.lifecycles), 2),
            },
            "api_latency": {op: summary(xs) for op, xs in tally.latencies.items()},
            "errors": dict(tally.errors),
            "error_examples": tally.examples,
            "warmup_errors": dict(warm.errors),
            "projection_lag": {
                "sampled_each_s_events": summary(samples.lag, unit="events", scale=1.0),
                "catch_up_after_load_s": round(catch_up_s, 3),
                "caught_up": checkpoint >= seq1,
                "checkpoint": checkpoint,
                "stream_last_seq": seq1,
            },
            "snapshot_workers": None
            if uploads is None
            else {
                **uploads,
                "sampled_backlog_of_one_node": summary(
                    samples.snapshot_backlog_one_node, unit="events", scale=1.0
                ),
            },
            "place_queue": {
                # fleet-wide limits of the one shared durable, whatever the fleet's size
                "max_ack_pending": place.config.max_ack_pending,
                "max_waiting": place.config.max_waiting,
                "pending": summary(samples.place_pending, unit="msgs", scale=1.0),
                "in_flight": summary(samples.place_in_flight, unit="msgs", scale=1.0),
                "waiting_pulls": summary(samples.place_waiting_pulls, unit="pulls", scale=1.0),
                "sample_failures": samples.failures,
            },
            "cpu_cores": {
                "under_load": under_load,
                # CPU milliseconds each lifecycle (4 commands, ~8 events) cost each group
                "ms_per_lifecycle": {
                    k: round(v * wall / max(1, tally.lifecycles_ok) * 1000, 2)
                    for k, v in under_load.items()
                },
                "idle_fleet": idle,
                "note": "cores = CPU seconds / wall seconds. postgres_all is every postgres "
                "process on this machine (it serves other databases too); host_busy "
                "is the whole machine, other workloads included",
            },
            "rss_mib": {name: [rss_mib(p) for p in pids] for name, pids in groups.items()},
            **await _report_db(pg, args.nodes),
            "nats": await _monitoring(cluster, bus),
        }
        return doc
    except Exception:  # what the fleet said before it failed (an interruption is no failure)
        for c in children:
            print(f"--- {c.name} (tail)\n{c.tail()}", file=sys.stderr)
        raise
    finally:
        await _teardown(cluster, children, clients, pg, bus, admin, db, root, args.keep)


async def _teardown(
    cluster: NatsCluster,
    children: list[Child],
    clients: list[httpx.AsyncClient],
    pg: Any,
    bus: Bus | None,
    admin: Any,
    db: str,
    root: Path,
    keep: bool,
) -> None:
    """Everything the run started, in order, each step whatever the others did."""
    for client in clients:
        with contextlib.suppress(Exception):
            await client.aclose()
    for c in children:  # APIs first (they were appended first), then the node processes
        c.terminate()
    deadline = time.monotonic() + 30
    for c in children:
        with contextlib.suppress(Exception):
            await asyncio.to_thread(c.reap, deadline)
    if pg is not None:
        with contextlib.suppress(Exception):
            await pg.close()
    if bus is not None:
        with contextlib.suppress(Exception):
            await bus.close()
    with contextlib.suppress(Exception):
        await asyncio.to_thread(cluster.stop)
    if admin is not None:
        with contextlib.suppress(Exception):
            await admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        with contextlib.suppress(Exception):
            await admin.close()
    if keep:
        print(f"fleet_sim: logs and stores kept in {root}", file=sys.stderr)
    else:
        shutil.rmtree(root, ignore_errors=True)


def _node_flags(args: argparse.Namespace) -> list[str]:
    """The node-side options, handed on to each node process."""
    flags = [
        "--node-capacity",
        str(args.node_capacity),
        "--host-delay-ms",
        str(args.host_delay_ms),
        "--heartbeat-s",
        str(args.heartbeat_s),
    ]
    if not args.routes:
        flags.append("--no-routes")
    if args.snapshot_workers:
        flags.append("--snapshot-workers")
    return flags


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--nodes", type=int, default=200)
    p.add_argument("--node-processes", type=int, default=4)
    p.add_argument("--apis", type=int, default=2)
    p.add_argument("--lifecycles", type=int, default=20000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--warmup", type=int, default=32, help="unmeasured lifecycles first")
    p.add_argument(
        "--idle-s",
        type=float,
        default=10.0,
        help="seconds the idle fleet's CPU is measured before the load",
    )
    p.add_argument("--node-capacity", type=int, default=32, help="sandboxes per node")
    p.add_argument(
        "--host-delay-ms",
        type=float,
        default=0.0,
        help="simulated time of each host operation (0: none)",
    )
    p.add_argument("--heartbeat-s", type=float, default=5.0)
    p.add_argument(
        "--no-routes",
        dest="routes",
        action="store_false",
        help="simulated nodes put no routes (a real node puts one per run)",
    )
    p.add_argument(
        "--snapshot-workers",
        action="store_true",
        help="run each node's snapshot worker (a node with a repository does)",
    )
    p.add_argument(
        "--creates-only",
        action="store_true",
        help="each lifecycle is a create and a kill: the sustained create rate",
    )
    p.add_argument(
        "--admission",
        action="store_true",
        help="the APIs check the teams' limits (never reached) on every create",
    )
    p.add_argument("--pg", default=PG, help="Postgres (superuser) to create the database on")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs, stores)")
    p.add_argument(
        "--serve-nodes", nargs=2, type=int, metavar=("FIRST", "COUNT"), help=argparse.SUPPRESS
    )
    p.add_argument("--root", help=argparse.SUPPRESS)
    return p


def cli() -> None:
    args = parser().parse_args()
    if args.serve_nodes is not None:
        run_loop(serve_nodes(args))
        return
    try:
        doc = asyncio.run(main(args))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print(
            "fleet_sim: interrupted; everything it started is stopped and removed", file=sys.stderr
        )
        raise SystemExit(130) from None
    emit("fleet_sim", doc)


if __name__ == "__main__":
    cli()
