"""The node role: this host's microVMs — runtime, templates, node worker, snapshot worker,
volume releaser, the repository's janitor and GC.

Alone in its process so a restore never waits behind HTTP parsing or a projection's SQL on
the same event loop: the control plane's share of a create is then only the bus hops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from datetime import timedelta
from pathlib import Path

import uvicorn

from aenv.roles.common import READY, RoleSettings, say
from bus import Bus, BusSettings
from bus.decisions import execute
from bus.tasks import cancel_and_wait
from domain import template as tp
from envd.version import ENVD_VERSION
from shared.lazybase import LAZY_ROOT
from shared.metrics import ConsumerGauges, Scrape
from workers.node.blockmetrics import BlockMetrics
from workers.node.blockservice import BlockService
from workers.node.disk import image_cache_dir
from workers.node.disk.captures import TemplateCaptures
from workers.node.disk.chunkroom import REFIT_EVERY_S, hold_chunk_cache, refit_chunk_cache
from workers.node.disk.node import NodeDisk
from workers.node.host import SandboxHost
from workers.node.image.cache import open_files
from workers.node.image.codeint import PORT as CI_PORT
from workers.node.image.codeint import TEMPLATE as CODE_INTERPRETER
from workers.node.image.lazy import LazyImages
from workers.node.image.supply import Fleet, ImageSupply
from workers.node.lazyend import end_lazy_vms
from workers.node.memory import MemoryHost
from workers.node.metrics import NodeMetrics
from workers.node.observe import GuestObserver
from workers.node.ports import Host
from workers.node.proxy import listen, node_proxy
from workers.node.runtime import Runtime
from workers.node.settings import NodeSettings, socket_path_problem
from workers.node.stopdrain import StopDrain
from workers.node.templates import TemplateCatalog, TemplateSpec
from workers.node.volumes.endpoint import VolumeEndpoint, release_content_writes
from workers.node.volumes.releaser import VolumeReleaser
from workers.node.worker import NodeWorker
from workers.snapshot import (
    BlobCache,
    ImageRepository,
    PosixStore,
    S3Config,
    S3Store,
    SnapshotRepository,
    SnapshotStore,
)
from workers.snapshot.gcmetrics import GcMetrics
from workers.snapshot.gcrun import RepositoryGc
from workers.snapshot.janitor import RepositoryJanitor
from workers.snapshot.metrics import TransferMetrics
from workers.snapshot.worker import SnapshotWorker

log = logging.getLogger(__name__)


#: What a stopping node keeps of its deadline for its last step, closing the bus. The
#: deadline (`aenv.serve.stop_deadline_s`) holds `NODE_TEARDOWN_S` for destroying the VMs;
#: a NATS that hangs must not keep the exit waiting for that allowance too.
LAST_STEP_S = 5


def _last_step_deadline() -> None:
    """Shorten a pending stop deadline (SIGALRM) to `LAST_STEP_S`; none pending: none set."""
    left = signal.alarm(0)
    if left:
        signal.alarm(min(left, LAST_STEP_S))


async def run_node(cfg: RoleSettings, stop: asyncio.Event) -> None:
    async with contextlib.AsyncExitStack() as stack:
        bus = await Bus.connect(BusSettings(nats_url=cfg.nats_url), name="aenv-node")
        stack.push_async_callback(bus.close)
        stack.callback(_last_step_deadline)  # runs just before bus.close
        node_cfg = NodeSettings(state_dir=cfg.data_dir / "node")
        metrics = NodeMetrics(node_cfg.node_id, Scrape())
        # the one disk budget of its state dir and image cache (a memory host has no cache)
        disk = NodeDisk(node_cfg, image_cache_dir() if node_cfg.node_host == "qemu" else None)
        host: Host
        if node_cfg.node_host == "memory":
            say("node host: in memory (no VMs: AENV_NODE_HOST=memory)")
            host = MemoryHost(
                capacity=node_cfg.capacity,
                delay_s=node_cfg.memory_host_delay_s,
                no_room_for=filter(None, node_cfg.memory_host_no_room_for.split(",")),
            )
            uploads, disk_mb = None, 2048
        else:
            host, uploads, disk_mb = await _qemu_host(cfg, node_cfg, bus, stack, metrics, disk)
        stack.push_async_callback(host.close)
        register = tp.RegisterTemplate(
            template_id="base",
            alias="base",
            envd_version=ENVD_VERSION,
            cpu_count=node_cfg.base_vcpus,
            memory_mb=node_cfg.base_mem_mib,
            disk_size_mb=disk_mb,
        )
        await execute(bus.templates, register)
        if node_cfg.code_interpreter:
            await execute(
                bus.templates,
                tp.RegisterTemplate(
                    template_id=CODE_INTERPRETER,
                    alias=CODE_INTERPRETER,
                    envd_version=ENVD_VERSION,
                    cpu_count=node_cfg.code_interpreter_vcpus,
                    memory_mb=node_cfg.code_interpreter_mem_mib,
                    disk_size_mb=disk_mb,
                ),
            )
        sock = listen(node_cfg.proxy_host, node_cfg.proxy_port)
        bound = f"{node_cfg.proxy_host}:{sock.getsockname()[1]}"
        observer = GuestObserver(host, every_s=node_cfg.metrics_every_s)
        worker = NodeWorker(
            bus,
            host,
            node_cfg,
            node_proxy=node_cfg.proxy_advertise or bound,
            on_moot=uploads.cancel if uploads else None,
            uploads_waiting=uploads.waiting if uploads else None,
            on_killed=observer.forget,
            metrics=metrics,
            disk=disk,
        )
        observer.on_disk_full = worker.guest_disk_full
        _watch(metrics, bus, worker, node_cfg.node_id, uploads is not None)
        token = node_cfg.metrics_token
        volumes = (
            VolumeEndpoint(bus, host.volumes, node_cfg.node_id)
            if isinstance(host, SandboxHost)
            else None
        )
        proxy = uvicorn.Server(
            uvicorn.Config(
                node_proxy(
                    host,
                    worker.ingress,
                    lambda: worker.serving,
                    observer,
                    exposition=metrics.scrape.render,
                    metrics_token=token.get_secret_value() if token else None,
                    volumes=volumes,
                ),
                log_level="warning",
                lifespan="off",
                log_config=None,
                access_log=False,
                timeout_keep_alive=75,
            )
        )
        proxy_task = asyncio.create_task(proxy.serve(sockets=[sock]))
        stack.push_async_callback(_stop_server, proxy, proxy_task)
        await worker.start()
        stack.push_async_callback(worker.stop)
        observer.start()
        stack.push_async_callback(observer.stop)
        if uploads is not None:  # after the worker took back this node's paused sandboxes
            await uploads.start()
            stack.push_async_callback(uploads.stop)
        if isinstance(host, SandboxHost):  # volume API writes a crash cut short
            await release_content_writes(bus, host.volumes, node_cfg.node_id)
        releaser = VolumeReleaser(bus, host, node_cfg.node_id)  # what ended sandboxes left
        await releaser.start()
        stack.push_async_callback(releaser.stop)
        say(f"node {node_cfg.node_id} serving (sandbox proxy on {bound})")
        say(READY)
        await stop.wait()
        if cfg.stop_drain == "pause":  # while the worker and the uploader still run
            await StopDrain(
                bus,
                node_cfg.node_id,
                host.running_ids,
                durable=uploads is not None,
                grace_s=cfg.stop_drain_s,
                say=say,
            ).run()
        say("node: draining in-flight work")


def _watch(metrics: NodeMetrics, bus: Bus, worker: NodeWorker, node_id: str, uploads: bool) -> None:
    """What the node's scrape reads fresh: its room and VMs, and its JetStream consumers
    (once its worker made them)."""
    metrics.watch(
        worker.host, worker.capacity.room, lambda: worker.disk.last, worker.node_disk.numbers
    )
    names = bus.names
    jetstream = ConsumerGauges(metrics.scrape, bus.js)
    jetstream.watch(
        names.command_stream,
        lambda: [names.node_consumer(node_id), names.place_consumer] if worker.serving else [],
    )
    if uploads:
        jetstream.watch(
            names.event_stream, lambda: [names.snapshot_consumer(node_id)] if worker.serving else []
        )


async def _qemu_host(
    cfg: RoleSettings,
    node_cfg: NodeSettings,
    bus: Bus,
    stack: contextlib.AsyncExitStack,
    metrics: NodeMetrics,
    disk: NodeDisk,
) -> tuple[SandboxHost, SnapshotWorker | None, int]:
    """QEMU microVMs: the `base` image and template ready, the runtime open, and the
    snapshot worker when there is a repository; with the base image's size in MiB."""
    repository = await _repository(cfg, node_cfg, stack, TransferMetrics(metrics.scrape), disk)
    service, lazy = (
        await _block_service(node_cfg, stack, metrics, disk)
        if repository is not None
        else (None, None)
    )
    if node_cfg.lazy_images == "on" and repository is None:
        say("lazy images: off (AENV_LAZY_IMAGES=on needs a snapshot repository)")
    supply = _image_supply(bus, node_cfg, repository, metrics, disk, lazy)
    say("preparing the default template `base` (first run in a fleet: debootstrap, ~2 min)")
    image = await supply.base(node_cfg.image_free_bytes)
    envd_rt = await supply.runtime()
    runtime = await Runtime.open(
        node_cfg.state_dir,
        kernel_for_probe=image.kernel,
        pool_target=node_cfg.slot_pool,
        slot_prefix=node_cfg.slot_prefix,
        slot_cidr=node_cfg.slot_cidr,
        egress=node_cfg.egress_enabled,
        runtime_disk=envd_rt.path,
        ram_pool_bytes=node_cfg.ram_pool_bytes,
        balloon=node_cfg.balloon,
    )
    stack.push_async_callback(runtime.close)
    # VM starts and the RAM pool's copies write under the node's one disk budget, and the
    # pool's ready copies are among what it may evict
    runtime.disk_budget = runtime.ram_pool.disk = disk.budget
    disk.evictor.ram_pool = runtime.ram_pool
    say(f"accelerator: {runtime.accel.accel} ({runtime.accel.reason})")
    base = TemplateSpec("base", vcpus=node_cfg.base_vcpus, mem_mib=node_cfg.base_mem_mib)
    catalog = TemplateCatalog(
        runtime,
        progress=lambda m: say(f"  template: {m}"),
        base=base,
        free_bytes=node_cfg.image_free_bytes,
    )
    catalog.register(base, lambda: image)  # the one `supply` found, fetched or built
    await catalog.get("base")
    if node_cfg.code_interpreter:
        await _code_interpreter(catalog, node_cfg, supply)
    host = SandboxHost(
        runtime,
        catalog,
        capacity=node_cfg.capacity,
        repository=repository,
        warm=node_cfg.warm_policy(),
        images=supply,  # imports built once per fleet; a capture's disks fetched by content
    )
    disk.held_by(lambda: _stood_on(host))
    if service is not None:  # down past QEMU's reconnect window: its VMs end, with a cause
        deaths, warm = host.disk_watch.deaths, host.warm
        service.on_down = lambda: end_lazy_vms(deaths, warm)
    disk.evictor.captures = TemplateCaptures(host, lambda: _busy(host), asyncio.get_running_loop())
    host.disk_watch.grace_s = node_cfg.disk_full_grace_s
    # a VM stopped on a full host disk: the budget evicts (rmtree: off the loop), then `cont`
    host.disk_watch.make_room = lambda nbytes: asyncio.to_thread(disk.budget.make_room, nbytes)
    # captures become durable through the node's snapshot worker
    uploads = SnapshotWorker(bus, node_cfg.node_id, host, repository) if repository else None
    if repository is not None:
        await _repository_gc(bus, node_cfg, repository, GcMetrics(metrics.scrape), stack)
    return host, uploads, image.rootfs.stat().st_size >> 20


async def _repository_gc(
    bus: Bus,
    node_cfg: NodeSettings,
    repository: SnapshotRepository,
    metrics: GcMetrics,
    stack: contextlib.AsyncExitStack,
) -> None:
    """The repository's janitor (manifests go with what they describe) and its periodic,
    leased blob GC: every node runs both, the fleet's share of the work goes to one."""
    janitor = RepositoryJanitor(bus, repository.store, retry=repository.retry, metrics=metrics)
    await janitor.start()
    stack.push_async_callback(janitor.stop)
    if node_cfg.repository_gc_every_s <= 0:
        return
    runner = RepositoryGc(
        bus,
        janitor,
        node_cfg.node_id,
        every_s=node_cfg.repository_gc_every_s,
        min_age=timedelta(seconds=node_cfg.repository_gc_min_age_s),
        image_grace=timedelta(seconds=node_cfg.repository_image_grace_s),
    )
    await runner.start()
    stack.push_async_callback(runner.stop)


def _busy(host: SandboxHost) -> set[str]:
    """Templates a running sandbox or a warm VM was restored from, or a create restores
    from now: their captures stay."""
    running = {s.template_id for s in list(host.sandboxes.values())}
    return running | set(host.warm_stats().ready) | host.starts.starting()


def _stood_on(host: SandboxHost) -> list[Path]:
    """Image files that paused sandboxes' captures stand on (base images, runtime disks)
    and the runtime disk new VMs boot with: the disk budget never evicts them (template
    captures say theirs as entries: `TemplateCaptures`). Read from the budget's thread:
    the host's dict is copied first."""
    snaps = [p.snapshot for p in list(host.paused.values())]
    return [f for s in snaps for f in (s.base_image, s.runtime_disk)] + [host.runtime.runtime_disk]


async def _block_service(
    node_cfg: NodeSettings, stack: contextlib.AsyncExitStack, metrics: NodeMetrics, disk: NodeDisk
) -> tuple[BlockService | None, LazyImages | None]:
    """With lazy images on: the node's block service (`aenv.roles.blocks`, a process of its
    own, supervised: `workers/node/blockservice.py`), started or adopted before any VM may
    read through it, stopped after every VM of this node is gone (the exit stack unwinds
    the host first) unless one still reads through it. Turned off, the service still runs
    while the cache holds lazy entries (captures stand on their stubs), and new images are
    fetched whole (no `LazyImages` for the supply). Its chunk cache's cap is held in the
    node's disk budget, lowered to fit it (`disk/chunkroom.py`)."""
    on = node_cfg.lazy_images == "on"
    if not on and not any((image_cache_dir() / "images").glob(f"*/{LAZY_ROOT}")):
        return None, None
    socket, where = node_cfg.blocks_socket_path, node_cfg.blocks_dir
    if (problem := socket_path_problem(socket)) is not None:  # off, with lazy entries left
        raise RuntimeError(problem)
    argv = [sys.executable, "-m", "aenv.roles.blocks", "serve", "--socket", str(socket)]
    cap = await asyncio.to_thread(hold_chunk_cache, disk.budget, where, node_cfg.blocks_cache_bytes)
    stack.callback(disk.budget.stops_growing, where)
    argv += ["--cache-dir", str(where), "--cache-bytes", str(cap)]
    service = BlockService(
        argv,
        socket,
        where / "blocks.pid",
        log_file=where / "blocks.log",
        in_use=_lazy_in_use,
    )
    await service.start()
    stack.push_async_callback(service.stop)
    fitting = asyncio.create_task(
        _refit_chunk_cache(disk, where, node_cfg.blocks_cache_bytes, cap), name="block-cap"
    )
    stack.push_async_callback(cancel_and_wait, fitting)
    stats = BlockMetrics(node_cfg.node_id, where / "stats.json", lambda: service.restarts)
    metrics.scrape.registry.register(stats)
    following = asyncio.create_task(stats.follow(), name="block-stats")
    stack.push_async_callback(cancel_and_wait, following)
    say(f"lazy images: {'on' if on else 'off'}, block service pid {service.pid} on {socket}")
    return service, (LazyImages(socket) if on else None)


async def _refit_chunk_cache(disk: NodeDisk, where: Path, setting: int, cap: int) -> None:
    """Fit the block cache's cap to the disk budget's room again, every `REFIT_EVERY_S`
    (`disk/chunkroom.py`); the service takes a new one from its cache dir."""
    while True:
        await asyncio.sleep(REFIT_EVERY_S)
        try:
            cap = await asyncio.to_thread(refit_chunk_cache, disk.budget, where, setting, cap)
        except Exception:  # a walk that failed: the cap in force stands until the next
            log.exception("block cache: fitting its cap to the disk budget failed")


def _lazy_in_use() -> bool:
    """Whether a process (a QEMU) holds a lazy base's stub of this node's image cache open:
    it reads through this node's block service (another node's cache is another's)."""
    mine = str(image_cache_dir().resolve()) + "/"
    return any(f.startswith(mine) and f.endswith(f"/{LAZY_ROOT}") for f in open_files())


def _image_supply(
    bus: Bus,
    node_cfg: NodeSettings,
    repository: SnapshotRepository | None,
    metrics: NodeMetrics,
    disk: NodeDisk,
    lazy: LazyImages | None = None,
) -> ImageSupply:
    """With a repository, this node's images are built once per fleet and fetched by the
    others (images-at-scale S5); without one, built here."""
    progress = lambda m: say(f"  image: {m}")  # noqa: E731
    if repository is None:
        return ImageSupply(progress=progress, budget=disk.budget)
    fleet = Fleet(
        bus.images,
        ImageRepository(repository.store, metrics=repository.metrics),
        node_cfg.node_id,
        on_fetched=metrics.image_fetched,
        on_built=metrics.image_built,
    )
    return ImageSupply(fleet=fleet, progress=progress, budget=disk.budget, lazy=lazy)


async def _code_interpreter(
    catalog: TemplateCatalog, node_cfg: NodeSettings, supply: ImageSupply
) -> None:
    """`code-interpreter-v1`: its image (built once per fleet, cached by digest) and its
    capture, taken once the server on 49999 answers with its default kernel started."""
    say(f"preparing `{CODE_INTERPRETER}` (first run in a fleet: apt in the image tree, minutes)")
    image = await supply.code_interpreter(node_cfg.image_free_bytes)
    spec = TemplateSpec(
        CODE_INTERPRETER,
        vcpus=node_cfg.code_interpreter_vcpus,
        mem_mib=node_cfg.code_interpreter_mem_mib,
        ready_port=CI_PORT,
    )
    catalog.register(spec, lambda: image)
    await catalog.get(CODE_INTERPRETER)


async def _stop_server(server: uvicorn.Server, task: asyncio.Task[None]) -> None:
    server.should_exit = True
    await task


async def _repository(
    cfg: RoleSettings,
    node_cfg: NodeSettings,
    stack: contextlib.AsyncExitStack,
    metrics: TransferMetrics,
    disk: NodeDisk,
) -> SnapshotRepository | None:
    """Pauses upload to S3 when the stack has one (embedded SeaweedFS or AENV_S3_*), else
    to a shared directory when one is set (AENV_SNAPSHOT_DIR, the POSIX store); neither:
    captures stay on this node."""
    store: SnapshotStore
    if cfg.s3_endpoint:
        store = await S3Store.open(
            S3Config(
                bucket=cfg.s3_bucket,
                endpoint_url=cfg.s3_endpoint,
                access_key=cfg.s3_access_key,
                secret_key=cfg.s3_secret_key,
            )
        )
        say(f"snapshot repository: S3 at {cfg.s3_endpoint}")
    elif cfg.snapshot_dir is not None:
        store = PosixStore(cfg.snapshot_dir)
        say(f"snapshot repository: directory {cfg.snapshot_dir}")
    else:
        return None
    stack.push_async_callback(store.close)
    cache = BlobCache(node_cfg.state_dir / "blob-cache", node_cfg.blob_cache_bytes)
    # up to its cap, what it holds plus what the node's disk budget has free
    cache.budget = disk.blob_cache_room(node_cfg.blob_cache_bytes, lambda: cache.used_bytes)
    disk.evictor.drop_blob = cache.drop
    return SnapshotRepository(store, cache, metrics=metrics)
