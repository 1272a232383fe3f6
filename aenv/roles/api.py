"""The api role: E2B REST API + envd proxy, the read-model projectors, the TTL timer, the
template builder and the sweeper of untagged template captures.

Everything it knows about VMs comes from the bus (outcome events, the routes bucket), so it
can restart mid-create: the node finishes the sandbox and the restarted API shows it.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Iterator
from pathlib import Path

import uvicorn
from sqlalchemy.ext.asyncio import AsyncEngine

from aenv.roles.common import READY, RoleSettings, say, write_private
from aenv.roles.leasetimer import lease_timer
from aenv.tls import Certificate, TlsError, TlsSettings, check_certificate
from aenv.tracing import instrument_engine
from api.admin import create_api_key, ensure_api_key
from api.app import create_app
from api.auth import KeyChecker
from api.captures import CaptureSweeper
from api.context import ApiContext, ApiSettings
from api.ingress import Ingress
from api.metrics import Metrics
from api.resume import auto_resume
from bus import Bus, BusSettings
from bus.nodes import NodeBook
from bus.teamfeed import TeamFeed
from domain import sandbox as sb
from projections import (
    Projector,
    SandboxProjection,
    all_projections,
    create_engine,
    migrate,
    queries,
)
from shared.metrics import ConsumerGauges
from shared.proxy import ASGIApp, RouteTable
from shared.stream_metrics import StreamGauges
from workers.build.builder import Builder, BuildSettings
from workers.build.metrics import BuildMetrics
from workers.timer import Timer
from workers.timer.settings import TimerSettings


async def run_api(cfg: RoleSettings, stop: asyncio.Event) -> None:
    tls = _certificate()  # before anything starts: a bad one is the operator's to fix
    say("migrating the read-model database")
    await migrate(cfg.database_url)  # every API of a fleet does: one at a time, idempotent
    async with contextlib.AsyncExitStack() as stack:
        bus_settings = BusSettings(nats_url=cfg.nats_url)
        bus = await Bus.connect(bus_settings, name="aenv-api")
        stack.push_async_callback(bus.close)
        await bus.answers()  # following the log before the first command, not on it
        engine = create_engine(cfg.database_url)
        instrument_engine(engine)  # its statements as spans, when tracing is on
        stack.push_async_callback(engine.dispose)
        projectors = {p.name: Projector(engine, bus.js, bus_settings, p) for p in all_projections()}
        for p in projectors.values():
            await p.start()
            stack.push_async_callback(p.stop)
        nodes = await NodeBook.open(bus.js, bus.names.nodes_bucket)
        nodes.follow()
        stack.push_async_callback(nodes.close)
        keep = TimerSettings().paused_retention_s
        timer = Timer(
            bus, seed=lambda: _timer_start(engine), nodes=nodes, paused_retention_s=keep or None
        )
        await timer.start()
        stack.push_async_callback(timer.stop)
        await _bootstrap_key(cfg, bus)
        ctx = _context(cfg, bus, engine, projectors, nodes)
        if ctx.settings.pipelines:
            await _pipelines(ctx, stack)
        leases = lease_timer(bus, engine, nodes, ctx.metrics.lease_expired)
        await leases.start()
        stack.push_async_callback(leases.stop)
        routes = await RouteTable.open(
            bus,
            via_node=ctx.settings.proxy_via_node,
            resume=auto_resume(ctx),
            resume_timeout_s=ctx.settings.command_timeout_s,
        )
        stack.push_async_callback(routes.close)
        sweeper = CaptureSweeper(ctx, grace_s=ctx.settings.capture_grace_s)
        await sweeper.start()
        stack.push_async_callback(sweeper.stop)
        app = create_app(ctx, routes.resolve)
        routes.on_gone.append(app.close_sandbox)
        servers = [await _listen(cfg, app)]
        if tls is not None:  # besides the plain port, which E2B_API_URL clients keep using
            servers.append(await _listen(cfg, app, tls))
        # Builds drive their build sandbox through this API's envd proxy, so after it listens.
        builder = Builder(
            bus,
            BuildSettings(proxy_url=f"http://{cfg.host}:{cfg.port}", files_dir=_files_dir(cfg)),
            parallel=cfg.build_parallel,
            published=lambda name: ctx.forget(f"tpl:{name}"),
            metrics=BuildMetrics(ctx.metrics.scrape),
        )
        await builder.start()
        stack.push_async_callback(builder.stop)
        say(READY)
        await stop.wait()
        say("api: draining requests")
        for server, _ in servers:
            server.should_exit = True
        for _, task in servers:
            await task


async def _pipelines(ctx: ApiContext, stack: contextlib.AsyncExitStack) -> None:
    """Per-team ingress and the stripped feed for least-privilege pipelines (issue 32)."""
    feed = TeamFeed(ctx.bus.js, ctx.bus.names, replicas=ctx.bus.settings.replicas)
    await feed.start()
    stack.push_async_callback(feed.stop)
    ingress = Ingress(ctx)
    await ingress.start()
    stack.push_async_callback(ingress.stop)


def _files_dir(cfg: RoleSettings) -> Path:
    """Where uploaded build contexts wait for their build (the API writes, builders read)."""
    return cfg.data_dir / "build-files"


def _context(
    cfg: RoleSettings,
    bus: Bus,
    engine: AsyncEngine,
    projectors: dict[str, Projector],
    nodes: NodeBook,
) -> ApiContext:
    """What the API's routes share; a write waits for the projection it is read back from."""
    sandboxes: Projector = projectors[SandboxProjection.name]

    async def wait_for(seq: int) -> None:
        await sandboxes.wait_for(seq)

    async def wait_for_templates(seq: int) -> None:
        await projectors["templates"].wait_for(seq)

    async def wait_for_volumes(seq: int) -> None:
        await projectors["volumes"].wait_for(seq)

    api_settings = ApiSettings(build_files_dir=_files_dir(cfg), upload_secret=_secret(cfg))
    return ApiContext(
        bus,
        engine,
        api_settings,
        KeyChecker(engine),
        wait_for=wait_for,
        wait_for_templates=wait_for_templates,
        wait_for_volumes=wait_for_volumes,
        nodes=nodes,
        metrics=_metrics(bus, engine, projectors, nodes, feed=api_settings.pipelines),
    )


def _certificate() -> tuple[Certificate, int] | None:
    """The certificate to serve HTTPS with and its port (`aenv.tls`), or None: no HTTPS."""
    settings = TlsSettings()
    try:
        given = settings.given()
        if given is None:
            return None
        assert settings.sandbox_domain is not None  # `given` checked it
        return check_certificate(*given, settings.sandbox_domain), settings.tls_port
    except TlsError as e:
        raise SystemExit(f"api: {e}") from e


async def _listen(
    cfg: RoleSettings, app: ASGIApp, tls: tuple[Certificate, int] | None = None
) -> tuple[uvicorn.Server, asyncio.Task[None]]:
    """The API served on its port (or HTTPS on the TLS port), once it listens (SystemExit
    if it cannot)."""
    port = cfg.port if tls is None else tls[1]
    cert = None if tls is None else tls[0]
    server = (uvicorn.Server if tls is None else _SecondServer)(
        uvicorn.Config(
            app,
            host=cfg.host,
            port=port,
            log_level="warning",
            lifespan="off",
            timeout_keep_alive=75,
            access_log=False,
            log_config=None,
            ssl_certfile=None if cert is None else cert.cert_file,
            ssl_keyfile=None if cert is None else cert.key_file,
        )  # its records go through ours (aenv.logs)
    )
    server_task = asyncio.create_task(_serve(server))
    while not server.started:
        if server_task.done():
            await server_task
            raise SystemExit(f"API could not listen on {cfg.host}:{port}")
        await asyncio.sleep(0.05)
    scheme = "http" if tls is None else "https"
    say(f"API listening on {scheme}://{cfg.host}:{port}")
    return server, server_task


class _SecondServer(uvicorn.Server):
    """The HTTPS listener beside the plain one: it leaves SIGTERM to the first. (Each
    uvicorn server swaps the process's signal handlers in and restores them when it ends;
    two doing so in turn could restore a handler of a server already gone.)"""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _serve(server: uvicorn.Server) -> None:
    """uvicorn's serve, whose `sys.exit(1)` when it cannot bind stays inside this task: a
    SystemExit out of a task stops the event loop at once, and the role's shutdown then ran
    among cancelled tasks — its NATS drain waited 30 s for subscriptions nobody read, and a
    crash-looping API (its port taken) took half a minute per attempt to say so."""
    try:
        await server.serve()
    except SystemExit:
        return  # uvicorn logged why; the role sees the task done before `started`


def _metrics(
    bus: Bus,
    engine: AsyncEngine,
    projectors: dict[str, Projector],
    nodes: NodeBook,
    *,
    feed: bool = False,
) -> Metrics:
    """The API role's series: its requests (counted by the app), the read model's sandboxes
    by state and node, each projection's lag, the builders' consumer and (`feed`) the
    pipelines' feed's, read at each scrape."""
    metrics = Metrics()

    async def census() -> list[tuple[str, str, int]]:
        async with engine.connect() as conn:
            return await queries.sandbox_census(conn)

    async def lags() -> dict[str, int | None]:
        return {name: await p.lag() for name, p in projectors.items()}

    metrics.count_sandboxes(census, lambda: (nodes.current() or {}).keys())
    metrics.measure_projections(lags)
    consumers = ConsumerGauges(metrics.scrape, bus.js)
    consumers.watch(bus.names.command_stream, lambda: [bus.names.build_consumer])
    if feed:  # the pipelines' feed (`bus.teamfeed`): how far its copy is behind the log
        consumers.watch(bus.names.event_stream, lambda: [bus.names.feed_consumer])
    StreamGauges(metrics.scrape, bus.js, [bus.names.event_stream, bus.names.command_stream])
    metrics.watch_heartbeats(lambda: (nodes.current() or {}).values())
    return metrics


async def _timer_start(engine: AsyncEngine) -> tuple[list[sb.Clock], int]:
    """The timer's start: the read model's clocks and the sequence they reflect, from one
    snapshot of the database."""
    async with engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="REPEATABLE READ")
        async with conn.begin():
            return await queries.timer_start(conn, SandboxProjection.name)


def _secret(cfg: RoleSettings) -> str:
    """The key that signs build-context upload links: the fleet's (`AENV_UPLOAD_SECRET`),
    else kept (0600) in the data dir so links survive a restart."""
    if cfg.upload_secret is not None:
        return cfg.upload_secret.get_secret_value()
    path = cfg.data_dir / "upload-secret"
    if not path.exists():
        write_private(path, secrets.token_hex(32) + "\n")
    return path.read_text().strip()


async def _bootstrap_key(cfg: RoleSettings, bus: Bus) -> str:
    """The stack's first API key: the operator's (`AENV_API_KEY`, registered by every API
    of a fleet), else minted once and kept (0600) for `aenv up` to print."""
    if cfg.api_key is not None:
        raw = cfg.api_key.get_secret_value()
        await ensure_api_key(bus, raw, name="AENV_API_KEY")
        return raw
    path = cfg.data_dir / "api-key"
    if path.exists():
        return path.read_text().strip()
    _, raw = await create_api_key(bus, name="aenv up")
    write_private(path, raw + "\n")
    return raw
