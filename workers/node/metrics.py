"""The node role's Prometheus series (`docs/observability.md`), served on its proxy port.

- `aenv_lifecycle_seconds{op, stage, start}`: how long each stage of a sandbox operation
  took on this node — `queue` (stored in JetStream → the node starts on it), `restore`
  (the VM restored until it runs), `envd_ready` (running → envd initialised), `total`
  (stored → the outcome appended). `start` is `cold` (restored from a template's capture)
  or `warm` (a create the warm pool's VM took: its `restore` is the hand-over).
- `aenv_node_vms_uncapped{node}`: running VMs without memory and CPU caps (no writable
  cgroup for them: alert on it; the ready answer's `warnings` says why).
- `aenv_vm_deaths_total{cause}`: VMs that exited without being asked — `oom` (their memory
  cgroup killed them), `disk-full` (stopped on a full host disk past its grace, ended by
  the node), `block-service` (on a lazy image whose block service stayed down past QEMU's
  reconnect window, ended by the node) or `crash` (anything else).
- Read at each scrape: the node's budget and what is left (`aenv_node_*`, label `node`),
  its running VMs, their summed RSS and CPU time, its JetStream consumers, and its warm
  pool (`aenv_node_warm_*`: VMs by template, their memory, creates it served or missed),
  and its RAM pool (`aenv_node_ram_pool_{bytes,files,budget_bytes}`: the ready RAM copies
  on its disk — evictable, within their budget `AENV_RAM_POOL_BYTES`).
- `aenv_node_guest_memory_bytes{node, kind}`: what the running sandboxes' QEMU processes
  hold, summed from their `smaps_rollup` (`usage.Smaps`): `rss`, `pss`, `shared` (pages
  another process maps too: fork children's untouched guest RAM, QEMU's code) and
  `private`; beside `aenv_node_guest_ram_bytes{node}`, the guest RAM those VMs were given
  (nominal), so PSS ÷ nominal is the node's real memory per promised byte. Read once per
  VM per scrape, in a thread (the kernel walks each process's page tables: ms per VM).
- `aenv_node_disk_bytes{node, category}`: what its data dirs allocate, by category
  (`workers/node/disk`), from its last disk walk (every minute, not at the scrape).
- `aenv_node_disk_budget_bytes{node}`, `aenv_node_disk_room_bytes{node}`,
  `aenv_node_disk_pinned_bytes{node}`: its one disk budget, free under it plus what it
  could evict, and what it cannot evict now (`disk.NodeDisk`).

Labels stay bounded: ops, stages and causes are closed sets; `node` is one value per node.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from domain import Command
from domain import sandbox as sb
from shared.metrics import Scrape
from workers.node.capacity import Room
from workers.node.disk import CATEGORIES, Tally
from workers.node.ports import Host
from workers.node.usage import SMAPS_FIELDS, CpuTally, Smaps, read_smaps, read_usage
from workers.node.vmm import limits

__all__ = ["CAUSES", "MEMORY_KINDS", "OPS", "STAGES", "NodeMetrics", "guest_memory", "op_of"]

log = logging.getLogger(__name__)

#: A stage takes milliseconds (a queue when idle, envd after a restore) to a minute (a
#: cold template pulled from the repository, a create queued behind a full fleet).
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
OPS: dict[type[Command], str] = {
    sb.CreateSandbox: "create",
    sb.ResumeSandbox: "resume",
    sb.PauseSandbox: "pause",
    sb.ForkSandbox: "fork",
    sb.SnapshotSandbox: "snapshot",
    sb.KillSandbox: "kill",
    sb.UpdateSandboxNetwork: "network",
}
STAGES = ("queue", "restore", "envd_ready", "total")
#: the stages each op has: only what starts a VM restores one
_STAGES_OF = {
    op: STAGES if op in ("create", "resume", "fork") else ("queue", "total") for op in OPS.values()
}
CAUSES = ("oom", "disk-full", "block-service", "crash")
#: the `kind` label of `aenv_node_guest_memory_bytes`: the fields of `usage.Smaps`
MEMORY_KINDS = SMAPS_FIELDS
COLD, WARM = "cold", "warm"


def _cold(_sandbox_id: str) -> bool:
    return False


def guest_memory(vms: dict[int, int], proc: str = "/proc") -> tuple[Smaps, int]:
    """The summed `Smaps` of the VMs `vms` names (QEMU pid → guest RAM, MiB) and the guest
    RAM, in bytes, of those that were read: a VM gone between the listing and its read
    counts on neither side."""
    total, nominal = Smaps(), 0
    for pid, mem_mib in vms.items():
        if (one := read_smaps(pid, proc)) is not None:
            total += one
            nominal += mem_mib << 20
    return total, nominal


def op_of(command: Command) -> str | None:
    """The lifecycle op a command is (None: not one, e.g. a template import)."""
    return OPS.get(type(command))


class _VmCpu(Collector):
    """`aenv_node_vm_cpu_seconds_total`: a counter whose value is read at the scrape."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.value = 0.0

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "aenv_node_vm_cpu_seconds",
            "CPU time the node's VMs (QEMU processes) used.",
            labels=["node"],
        )
        family.add_metric([self.node], self.value)
        yield family


class _WarmClaims(Collector):
    """`aenv_node_warm_claims_total{node, result}`: creates the warm pool served (`hit`) or
    could not (`miss`), counted by the pool and read at the scrape."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.hits = 0
        self.misses = 0

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "aenv_node_warm_claims",
            "Creates the warm pool handed a VM (hit) or could not (miss).",
            labels=["node", "result"],
        )
        family.add_metric([self.node, "hit"], self.hits)
        family.add_metric([self.node, "miss"], self.misses)
        yield family


class NodeMetrics:
    def __init__(self, node_id: str, scrape: Scrape | None = None) -> None:
        self.node = node_id
        self.scrape = scrape or Scrape()
        r = self.scrape.registry
        self.lifecycle = Histogram(
            "aenv_lifecycle_seconds",
            "Sandbox operation stages on the node: queue, restore, envd_ready, total.",
            ["op", "stage", "start"],
            buckets=BUCKETS,
            registry=r,
        )
        for op, stages in _STAGES_OF.items():
            for stage in stages:
                self.lifecycle.labels(op, stage, COLD)
        self.deaths = Counter(
            "aenv_vm_deaths",
            "VMs that exited without being asked, by cause.",
            ["cause"],
            registry=r,
        )
        for cause in CAUSES:
            self.deaths.labels(cause)
        self.image_builds = Counter(
            "aenv_image_builds",
            "Images the node imported as templates (pulled or read, converted, booted once, "
            "captured): one per import, however many creates or builds waited for it.",
            ["node"],
            registry=r,
        )
        self.image_builds.labels(node_id)
        # images-at-scale S5: the node's own images (base, envd's runtime, code interpreter)
        # are built once per fleet; every other node fetches them from the repository
        self.image_fleet_builds = Counter(
            "aenv_image_fleet_builds",
            "Images this node built for the fleet (it won the recipe's claim), by image.",
            ["node", "image"],
            registry=r,
        )
        self.image_fetches = Counter(
            "aenv_image_fetches",
            "Images this node fetched from the repository instead of building them.",
            ["node"],
            registry=r,
        )
        self.image_fetch_bytes = Counter(
            "aenv_image_fetch_bytes",
            "Bytes of images fetched from the repository (stored chunks, holes not counted).",
            ["node"],
            registry=r,
        )
        self.image_fetch_seconds = Counter(
            "aenv_image_fetch_seconds",
            "Time spent fetching images from the repository, lock waits included.",
            ["node"],
            registry=r,
        )
        for c in (self.image_fetches, self.image_fetch_bytes, self.image_fetch_seconds):
            c.labels(node_id)
        for image in ("base", "runtime", "code-interpreter"):  # at zero: a fetching node's
            self.image_fleet_builds.labels(node_id, image)
        self._room = {
            name: Gauge(f"aenv_node_{name}", text, ["node"], registry=r)
            for name, text in _ROOM.items()
        }
        self.vms = Gauge(
            "aenv_node_vms", "VMs (running sandboxes) on the node.", ["node"], registry=r
        )
        self.paused = Gauge(
            "aenv_node_paused_sandboxes",
            "Paused sandboxes whose captures the node holds.",
            ["node"],
            registry=r,
        )
        self.rss = Gauge(
            "aenv_node_vm_rss_bytes", "Resident memory of the node's VMs.", ["node"], registry=r
        )
        self.guest_memory = Gauge(
            "aenv_node_guest_memory_bytes",
            "Memory of the running sandboxes' QEMU processes (smaps_rollup): rss, pss, "
            "shared (mapped by another process too), private.",
            ["node", "kind"],
            registry=r,
        )
        self.guest_ram = Gauge(
            "aenv_node_guest_ram_bytes",
            "Guest RAM the running sandboxes' VMs were given (nominal).",
            ["node"],
            registry=r,
        )
        self.read_guest_memory(Smaps(), 0)
        self.uncapped = Gauge(
            "aenv_node_vms_uncapped",
            "Running VMs without memory and CPU caps (no writable cgroup for them).",
            ["node"],
            registry=r,
        )
        self._cpu = _VmCpu(node_id)
        r.register(self._cpu)
        self._tally = CpuTally()
        self.warm_vms = Gauge(
            "aenv_node_warm_vms",
            "Warm VMs ready for a create, by template.",
            ["node", "template"],
            registry=r,
        )
        self.warm_mem = Gauge(
            "aenv_node_warm_memory_mib",
            "Memory (MiB, the templates' sizes) the warm pool holds.",
            ["node"],
            registry=r,
        )
        self.warm_rss = Gauge(
            "aenv_node_warm_rss_bytes",
            "Resident memory of the warm pool's QEMU processes.",
            ["node"],
            registry=r,
        )
        self._claims = _WarmClaims(node_id)
        r.register(self._claims)
        self.ram_pool = {
            name: Gauge(f"aenv_node_ram_pool_{name}", text, ["node"], registry=r)
            for name, text in _RAM_POOL.items()
        }
        self.disk = Gauge(
            "aenv_node_disk_bytes",
            "Bytes the node's data dirs allocate, by category (its last disk walk).",
            ["node", "category"],
            registry=r,
        )
        self.disk_budget = {
            name: Gauge(f"aenv_node_disk_{name}_bytes", text, ["node"], registry=r)
            for name, text in _DISK_BUDGET.items()
        }

    # ---- where things happen ----------------------------------------------------------
    def stage(self, op: str, stage: str, seconds: float, start: str = COLD) -> None:
        self.lifecycle.labels(op, stage, start).observe(max(0.0, seconds))

    def died(self, cause: str) -> None:
        self.deaths.labels(cause if cause in CAUSES else "crash").inc()

    @contextmanager
    def operation(
        self, command: Command, stored_at: datetime, warm: Callable[[str], bool] = _cold
    ) -> Iterator[None]:
        """Around a command's handling: once it succeeded, its queue time and its total (a
        command passed on or failed is not an operation done); `warm(sandbox_id)`: whether
        a create's sandbox was a warm VM (its start label)."""
        op = op_of(command)
        if op is None:
            yield
            return
        t0 = time.monotonic()
        queued = (datetime.now(UTC) - stored_at).total_seconds()
        yield
        total = queued + time.monotonic() - t0
        sandbox_id = getattr(command, "sandbox_id", "")
        start = WARM if op == "create" and warm(sandbox_id) else COLD
        self.stage(op, "queue", queued, start)
        self.stage(op, "total", total, start)
        log.info("%s done in %.0f ms (%.0f ms queued, %s)", op, total * 1000, queued * 1000, start)

    # ---- read at each scrape ----------------------------------------------------------
    def image_fetched(self, nbytes: int, seconds: float) -> None:
        """One image fetched from the repository (`ImageSupply`)."""
        self.image_fetches.labels(self.node).inc()
        self.image_fetch_bytes.labels(self.node).inc(nbytes)
        self.image_fetch_seconds.labels(self.node).inc(seconds)

    def image_built(self, image: str) -> None:
        """One image this node built for the fleet (`ImageSupply`)."""
        self.image_fleet_builds.labels(self.node, image).inc()

    def watch(
        self,
        host: Host,
        room: Callable[[], Room],
        disk: Callable[[], Tally | None] | None = None,
        budget: Callable[[], dict[str, int | None]] | None = None,
    ) -> None:
        """`disk`: the node's last disk walk (`disk.DiskUsage.last`), None before one ended;
        `budget`: its disk budget's numbers by `_DISK_BUDGET` name (`disk.NodeDisk.numbers`)."""

        async def refresh() -> None:
            self.read(host, room())
            if disk is not None and (tally := disk()) is not None:
                self.read_disk(tally)
            for name, value in (budget() if budget is not None else {}).items():
                if value is not None:
                    self.disk_budget[name].labels(self.node).set(value)

        async def memory() -> None:
            vms = host.vm_guest_ram()  # on the loop: the host's table; the reads off it
            self.read_guest_memory(*await asyncio.to_thread(guest_memory, vms))

        self.scrape.on_scrape("node", refresh)
        self.scrape.on_scrape("guest_memory", memory)

    def read_guest_memory(self, total: Smaps, nominal_bytes: int) -> None:
        for kind in MEMORY_KINDS:
            self.guest_memory.labels(self.node, kind).set(getattr(total, kind))
        self.guest_ram.labels(self.node).set(nominal_bytes)

    def read_disk(self, tally: Tally) -> None:
        for category in CATEGORIES:
            self.disk.labels(self.node, category).set(tally.bytes[category])

    def read(self, host: Host, room: Room) -> None:
        node = self.node
        for name, value in (
            ("capacity_sandboxes", room.sandboxes),
            ("free_sandboxes", room.free_sandboxes),
            ("vcpus", room.vcpus),
            ("free_vcpus", room.free_vcpus),
            ("memory_mib", room.mem_mib),
            ("free_memory_mib", room.free_mem_mib),
        ):
            self._room[name].labels(node).set(value)
        self.vms.labels(node).set(host.running)
        self.paused.labels(node).set(host.paused_count)
        pids = list(host.vm_guest_ram())
        self.uncapped.labels(node).set(limits.uncapped(pids))
        usage = {pid: u for pid in pids if (u := read_usage(pid)) is not None}
        self.rss.labels(node).set(sum(u.rss_bytes for u in usage.values()))
        self._cpu.value = self._tally.total((pid, u.cpu_s) for pid, u in usage.items())
        pool = host.warm_stats()
        self.warm_vms.clear()  # a template the pool no longer keeps goes from the scrape
        for template, n in pool.ready.items():
            self.warm_vms.labels(node, template).set(n)
        self.warm_mem.labels(node).set(pool.mem_mib)
        self.warm_rss.labels(node).set(
            sum(u.rss_bytes for pid in pool.pids if (u := read_usage(pid)) is not None)
        )
        self._claims.hits, self._claims.misses = pool.hits, pool.misses
        ram = host.ram_pool_stats()
        for name, value in (
            ("bytes", ram.bytes),
            ("files", ram.files),
            ("budget_bytes", ram.budget),
        ):
            self.ram_pool[name].labels(node).set(value)


_DISK_BUDGET = {
    "budget": "Bytes the node may keep on disk (its one budget: state dir and image cache).",
    "room": "Free bytes under the node's disk budget plus what it could evict.",
    "pinned": "Bytes on the node's disk it cannot evict now (in use by VMs and captures).",
}

_RAM_POOL = {
    "bytes": "Bytes of ready RAM copies on the node's disk (evictable: a cache).",
    "files": "Ready RAM copies on the node's disk.",
    "budget_bytes": "The most the RAM pool holds (AENV_RAM_POOL_BYTES).",
}
_ROOM = {
    "capacity_sandboxes": "Sandboxes the node holds at most.",
    "free_sandboxes": "Sandboxes the node takes more of now.",
    "vcpus": "vCPUs the node gives sandboxes (after overcommit).",
    "free_vcpus": "vCPUs of that budget not taken.",
    "memory_mib": "Memory (MiB) the node gives sandboxes (after overcommit).",
    "free_memory_mib": "Memory (MiB) of that budget not taken.",
}
