"""`aenv serve`: one node's whole stack in one process — API + envd proxy, node worker,
projectors and TTL timer — over embedded or external NATS, Postgres and S3.

The composition root (conventions rule 11): settings validated once, every resource
entered on one exit stack and closed in reverse order, SIGTERM drains in-flight work.
Progress lines go to stdout (`aenv up` relays them); the last one is `AENV-READY {json}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import stat
import sys
from pathlib import Path
from typing import Any

import uvicorn
from pydantic_settings import BaseSettings, SettingsConfigDict

from aenv.tracing import setup_tracing
from api.admin import create_api_key
from api.app import create_app
from api.auth import KeyChecker
from api.context import ApiContext, ApiSettings
from api.proxy import SandboxUnavailable, Upstream
from bus import Bus, BusSettings
from bus.decisions import register_template
from envd.version import ENVD_VERSION
from projections import Projector, SandboxProjection, all_projections, create_engine, migrate
from workers.node.host import SandboxHost
from workers.node.image import build_base
from workers.node.runtime import Runtime
from workers.node.settings import NodeSettings
from workers.node.templates import TemplateCatalog, TemplateSpec
from workers.node.worker import NodeWorker
from workers.snapshot import BlobCache, S3Config, S3Store, SnapshotRepository
from workers.timer import Timer

log = logging.getLogger("aenv")

READY = "AENV-READY"


class StackSettings(BaseSettings):
    """Where the stack keeps its data and which external services to use instead of the
    embedded ones (`AENV_NATS_URL`, `AENV_DATABASE_URL`, `AENV_S3_ENDPOINT`...)."""

    model_config = SettingsConfigDict(env_prefix="AENV_", frozen=True, extra="ignore")

    data_dir: Path = Path("/var/lib/aenv")
    host: str = "127.0.0.1"
    port: int = 3000
    nats_url: str | None = None
    database_url: str | None = None
    s3_endpoint: str | None = None
    s3_access_key: str | None = None
    s3_secret_key: str | None = None
    embedded_s3: bool = True


def say(msg: str) -> None:
    print(msg, flush=True)


def _async_url(url: str) -> str:
    return (
        url.replace("postgresql://", "postgresql+asyncpg://", 1) if "+asyncpg" not in url else url
    )


async def _services(cfg: StackSettings, stack: contextlib.AsyncExitStack) -> dict[str, Any]:
    from aenv.stack import EmbeddedNats, EmbeddedPostgres, EmbeddedS3

    out: dict[str, Any] = {}
    data = cfg.data_dir / "services"
    if cfg.nats_url:
        out["nats_url"] = cfg.nats_url
    else:
        nats = EmbeddedNats(data)
        say(f"starting embedded NATS (JetStream) on 127.0.0.1:{nats.port}")
        out["nats_url"] = await nats.start()
        stack.push_async_callback(nats.stop)
    if cfg.database_url:
        out["database_url"] = _async_url(cfg.database_url)
    else:
        pg = EmbeddedPostgres(data)
        say(f"starting embedded Postgres on 127.0.0.1:{pg.port}")
        out["database_url"] = _async_url(await pg.start("aenv"))
        stack.push_async_callback(pg.stop)
    if cfg.s3_endpoint:
        out["s3"] = {"url": cfg.s3_endpoint, "access_key": cfg.s3_access_key,
                     "secret_key": cfg.s3_secret_key}  # fmt: skip
    elif cfg.embedded_s3:
        s3 = EmbeddedS3(data)
        say(f"starting embedded S3 (SeaweedFS) on 127.0.0.1:{s3.s3_port}")
        ep = await s3.start()
        stack.push_async_callback(s3.stop)
        out["s3"] = {"url": ep.url, "access_key": ep.access_key, "secret_key": ep.secret_key}
    return out


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, stat.S_IRUSR | stat.S_IWUSR)
    with os.fdopen(fd, "w") as f:
        f.write(text)


async def serve(cfg: StackSettings, stop: asyncio.Event) -> None:
    async with contextlib.AsyncExitStack() as stack:
        services = await _services(cfg, stack)
        say("migrating the read-model database")
        await migrate(services["database_url"])
        bus_settings = BusSettings(nats_url=services["nats_url"])
        bus = await Bus.connect(bus_settings, name="aenv-serve")
        stack.push_async_callback(bus.close)
        engine = create_engine(services["database_url"])
        stack.push_async_callback(engine.dispose)

        projectors = {p.name: Projector(engine, bus.js, bus_settings, p) for p in all_projections()}
        for p in projectors.values():
            await p.start()
            stack.push_async_callback(p.stop)

        node_cfg = NodeSettings(state_dir=cfg.data_dir / "node")
        say("preparing the default template `base` (first run: debootstrap, ~2 min)")
        image = await asyncio.to_thread(build_base, progress=lambda m: say(f"  image: {m}"))
        runtime = await Runtime.open(
            node_cfg.state_dir, kernel_for_probe=image.kernel,
            pool_target=node_cfg.slot_pool, slot_prefix=node_cfg.slot_prefix,
        )  # fmt: skip
        stack.push_async_callback(runtime.close)
        say(f"accelerator: {runtime.accel.accel} ({runtime.accel.reason})")
        base = TemplateSpec("base", vcpus=node_cfg.base_vcpus, mem_mib=node_cfg.base_mem_mib)
        catalog = TemplateCatalog(runtime, progress=lambda m: say(f"  template: {m}"), base=base)
        await catalog.get("base")
        await register_template(
            bus.templates, "base", alias="base", envd_version=ENVD_VERSION, cpu_count=base.vcpus,
            memory_mb=base.mem_mib, disk_size_mb=image.rootfs.stat().st_size >> 20,
        )  # fmt: skip
        repository = await _repository(services, node_cfg, stack)
        host = SandboxHost(runtime, catalog, capacity=node_cfg.capacity, repository=repository)
        stack.push_async_callback(host.close)
        worker = NodeWorker(bus, host, node_cfg)
        await worker.start()
        stack.push_async_callback(worker.stop)
        timer = Timer(bus)
        await timer.start()
        stack.push_async_callback(timer.stop)

        api_key = await _bootstrap_key(cfg, bus)
        sandboxes: Projector = projectors[SandboxProjection.name]

        async def wait_for(seq: int) -> None:
            await sandboxes.wait_for(seq)

        ctx = ApiContext(bus, engine, ApiSettings(), KeyChecker(engine), wait_for=wait_for)

        async def resolve(sandbox_id: str, port: int) -> Upstream:
            addr = host.upstream(sandbox_id)
            if addr is None:
                raise SandboxUnavailable(sandbox_id)
            return Upstream(addr, port)

        app = create_app(ctx, resolve)
        host.on_gone.append(app.close_sandbox)
        server = uvicorn.Server(
            uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level="warning",
                           lifespan="off", timeout_keep_alive=75, access_log=False)
        )  # fmt: skip
        server_task = asyncio.create_task(server.serve())
        while not server.started:
            if server_task.done():
                await server_task
                raise SystemExit(f"API could not listen on {cfg.host}:{cfg.port}")
            await asyncio.sleep(0.05)
        url = f"http://{cfg.host}:{cfg.port}"
        info = {"E2B_API_URL": url, "E2B_SANDBOX_URL": url, "E2B_API_KEY": api_key,
                "nats_url": services["nats_url"], "database_url": services["database_url"],
                "pid": os.getpid()}  # fmt: skip
        _write_private(cfg.data_dir / "stack.json", json.dumps(info, indent=2))
        say(f"{READY} {json.dumps({k: info[k] for k in ('E2B_API_URL', 'E2B_SANDBOX_URL')})}")
        await stop.wait()
        say("stopping: draining in-flight work")
        server.should_exit = True
        await server_task


async def _repository(
    services: dict[str, Any], node_cfg: NodeSettings, stack: contextlib.AsyncExitStack
) -> SnapshotRepository | None:
    """Pauses upload to S3 when the stack has one (embedded SeaweedFS or AENV_S3_*)."""
    s3 = services.get("s3")
    if not s3:
        return None
    store = await S3Store.open(S3Config(
        bucket=os.environ.get("AENV_S3_BUCKET", "aenv-snapshots"), endpoint_url=s3["url"],
        access_key=s3["access_key"], secret_key=s3["secret_key"],
    ))  # fmt: skip
    stack.push_async_callback(store.close)
    cache = BlobCache(node_cfg.state_dir / "blob-cache", node_cfg.blob_cache_bytes)
    say(f"snapshot repository: S3 at {s3['url']}")
    return SnapshotRepository(store, cache)


async def _bootstrap_key(cfg: StackSettings, bus: Bus) -> str:
    """The stack's first API key, minted once and kept (0600) for `aenv up` to print."""
    path = cfg.data_dir / "api-key"
    if path.exists():
        return path.read_text().strip()
    _, raw = await create_api_key(bus, name="aenv up")
    _write_private(path, raw + "\n")
    return raw


def _dump_tasks() -> None:
    """SIGUSR1: print every asyncio task's stack (where is a stuck start-up waiting?)."""
    for task in asyncio.all_tasks():
        print(f"--- {task.get_name()}", file=sys.stderr)
        task.print_stack(limit=12, file=sys.stderr)
    sys.stderr.flush()


def main() -> None:
    logging.basicConfig(level=os.environ.get("AENV_LOG_LEVEL", "INFO"),
                        format='{"ts":"%(asctime)s","level":"%(levelname)s",'
                               '"logger":"%(name)s","msg":"%(message)s"}')  # fmt: skip
    cfg = StackSettings()
    setup_tracing("aenv")

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal(sig: signal.Signals) -> None:
            say(f"received {sig.name}")
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
        loop.add_signal_handler(signal.SIGUSR1, _dump_tasks)
        await serve(cfg, stop)

    asyncio.run(run())


if __name__ == "__main__":
    main()
