"""`aenv serve`: one node's whole stack — embedded or external NATS, Postgres and S3, and
two supervised role processes: `node` (microVMs) and `api` (HTTP + proxy, projections,
timer). `python -m aenv.serve node|api` runs one role alone (what the supervisor starts).

Two processes, not one: a restore must not wait behind the API's or a projector's work on
a shared event loop, and either side can restart (or crash) while the other keeps going.
The composition root (conventions rule 11): settings validated once, every resource
entered on one exit stack and closed in reverse order, SIGTERM drains in-flight work.
Progress lines go to stdout (`aenv up` relays them); the last one is `AENV-READY {json}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import secrets
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic_settings import BaseSettings, SettingsConfigDict

from aenv import eventloop, logs
from aenv.roles.common import RoleSettings, say, write_private
from aenv.roles.startagain import start_again
from aenv.settings import report_unknown
from aenv.stack.process import ManagedProcess
from aenv.stack.records import LOCK, ProcessBook
from aenv.stack.stacklog import StackLog
from aenv.stack.watch import keep_running
from aenv.supervise import RoleProcess
from aenv.tls import StackTls, TlsError, TlsSettings, stack_tls
from aenv.tracing import setup_tracing
from bus import supervised
from bus.errors import LimitsMismatch, ReplicasMismatch

log = logging.getLogger("aenv")

READY = "AENV-READY"
#: sysexits' EX_CONFIG: a role refused to start on its configuration (a unit may list it
#: in `RestartPreventExitStatus=`: restarting cannot fix an env file).
EXIT_CONFIG = 78
#: A role's exit status when one of its background tasks kept dying (EX_SOFTWARE): never
#: 0, so `Restart=on-failure` restarts it as well as `Restart=always` does
TASK_DIED = 70


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
    #: Longest wait between restarts of a crashed role or embedded server (`aenv.backoff`).
    restart_cap_s: float = 30.0
    #: The stack's log file (`aenv up` sets `<data dir>/aenv.log`); None: stdout/stderr, for
    #: a service manager's journal. Rotated past `log_max_mb` MiB, `log_backups` kept.
    log_file: Path | None = None
    log_max_mb: float = 64.0
    log_backups: int = 5


def _async_url(url: str) -> str:
    return (
        url.replace("postgresql://", "postgresql+asyncpg://", 1) if "+asyncpg" not in url else url
    )


@dataclass
class Services:
    """Where the roles find NATS, Postgres and S3, and the embedded servers to keep alive
    (with how to start each again)."""

    urls: dict[str, Any] = field(default_factory=dict)
    embedded: list[tuple[ManagedProcess, Callable[[], Awaitable[object]]]] = field(
        default_factory=list
    )


async def _services(
    cfg: StackSettings, stack: contextlib.AsyncExitStack, book: ProcessBook
) -> Services:
    from aenv.stack import EmbeddedNats, EmbeddedPostgres, EmbeddedS3

    out = Services()
    data = cfg.data_dir / "services"

    def embed(process: ManagedProcess, start: Callable[[], Awaitable[object]]) -> None:
        process.on_start = lambda name, pid: book.note(
            name, pid, stop_signal=process.stop_signal, group=True
        )
        out.embedded.append((process, start))

    if cfg.nats_url:
        out.urls["nats_url"] = cfg.nats_url
    else:
        nats = EmbeddedNats(data, prefix=os.environ.get("AENV_BUS_PREFIX", ""))
        embed(nats.process, nats.start)
        say(f"starting embedded NATS (JetStream) on 127.0.0.1:{nats.port}")
        out.urls["nats_url"] = await nats.start()
        stack.push_async_callback(nats.stop)
    if cfg.database_url:
        out.urls["database_url"] = _async_url(cfg.database_url)
    else:
        pg = EmbeddedPostgres(data, private_root=cfg.data_dir)
        embed(pg.process, lambda: pg.start("aenv"))
        say(f"starting embedded Postgres on 127.0.0.1:{pg.port}")
        out.urls["database_url"] = _async_url(await pg.start("aenv"))
        stack.push_async_callback(pg.stop)
    if cfg.s3_endpoint:
        out.urls["s3"] = {
            "url": cfg.s3_endpoint,
            "access_key": cfg.s3_access_key,
            "secret_key": cfg.s3_secret_key,
        }
    elif cfg.embedded_s3:
        s3 = EmbeddedS3(data)
        embed(s3.process, s3.start)
        say(f"starting embedded S3 (SeaweedFS) on 127.0.0.1:{s3.s3_port}")
        ep = await s3.start()
        stack.push_async_callback(s3.stop)
        out.urls["s3"] = {"url": ep.url, "access_key": ep.access_key, "secret_key": ep.secret_key}
    return out


def _lock(data_dir: Path) -> int:
    """Hold the data dir's lock for the supervisor's life: two supervisors on one data dir
    would fight over its servers' data. The kernel drops it however the process ends."""
    data_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(data_dir, 0o700)  # the stack's alone (embedded Postgres's user: let in by group)
    fd = os.open(data_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise SystemExit(f"another aenv supervisor holds {data_dir / LOCK}") from None
    return fd


async def serve(cfg: StackSettings, stop: asyncio.Event) -> None:
    """Services, schema, then the two roles; restart a role or server that dies, until
    `stop`."""
    lock = _lock(cfg.data_dir)
    book = ProcessBook(cfg.data_dir)
    book.note("supervisor", os.getpid())
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(os.close, lock)
        tls = _tls(cfg)
        services = await _services(cfg, stack, book)
        urls = services.urls
        env = _role_env(cfg, urls)  # (the api role migrates the read-model database)
        env |= tls.role_env() if tls is not None else {}
        role_cfg = RoleSettings()
        roles = {
            name: RoleProcess(
                name,
                env,
                say,
                restart_cap_s=cfg.restart_cap_s,
                stop_timeout_s=stop_deadline_s(name, role_cfg) + 10,
                on_start=book.note,
            )
            for name in ("node", "api")
        }
        for role in roles.values():
            await role.start()
            stack.push_async_callback(role.stop)  # api stops first (pushed last), then node
        for role in roles.values():
            await role.wait_ready()
        info = _publish(cfg, urls, roles, tls)
        say(f"{READY} {json.dumps({k: info[k] for k in ('E2B_API_URL', 'E2B_SANDBOX_URL')})}")
        async with asyncio.TaskGroup() as group:
            for process, start in services.embedded:
                group.create_task(keep_running(process, start, stop, say, cap_s=cfg.restart_cap_s))
            group.create_task(_watch(roles, stop, lambda: _publish(cfg, urls, roles, tls)))
        say("stopping: draining in-flight work")


def _tls(cfg: StackSettings) -> StackTls | None:
    """How the stack serves HTTPS (`aenv.tls`): checked, or its local CA made, before any
    service starts — a certificate that cannot serve the domain stops `aenv up` here."""
    try:
        tls = stack_tls(TlsSettings(), cfg.data_dir)
    except TlsError as e:
        raise SystemExit(f"aenv: {e}") from e
    if tls is not None:
        how = "the local CA's" if tls.ca_file is not None else "the given"
        say(f"serving https://api.{tls.domain} and *.{tls.domain} with {how} certificate")
    return tls


def _publish(
    cfg: StackSettings,
    services: dict[str, Any],
    roles: dict[str, RoleProcess],
    tls: StackTls | None = None,
) -> dict[str, Any]:
    """stack.json (0600): what `aenv up/down/status` and the CLI read to find the stack."""
    api_key = (cfg.data_dir / "api-key").read_text().strip()
    url = f"http://{cfg.host}:{cfg.port}"
    info = {
        "E2B_API_URL": url,
        "E2B_SANDBOX_URL": url,
        "E2B_VOLUME_API_URL": url,
        "E2B_API_KEY": api_key,
        **(tls.client_env() if tls is not None else {}),
        "nats_url": services["nats_url"],
        "database_url": services["database_url"],
        "metrics_token": _metrics_token(cfg),
        "pid": os.getpid(),
        "roles": {n: r.proc.pid for n, r in roles.items() if r.proc},
        "role_status": {n: r.status() for n, r in roles.items()},
    }
    write_private(cfg.data_dir / "stack.json", json.dumps(info, indent=2))
    return info


async def _watch(
    roles: dict[str, RoleProcess], stop: asyncio.Event, changed: Callable[[], object]
) -> None:
    """Until `stop`: each role restarted on its own whenever it exits (its state lives on
    the bus). Independently: the node (and its VMs) keeps running through an API crash
    loop, and the API keeps answering (readiness says the node is gone) through a node's."""
    async with asyncio.TaskGroup() as group:
        for role in roles.values():
            group.create_task(role.supervise(stop, changed))


def _role_env(cfg: StackSettings, services: dict[str, Any]) -> dict[str, str]:
    """What a role needs to find the services (the supervisor's choice, not the user's)."""
    env = {
        **os.environ,
        "AENV_DATA_DIR": str(cfg.data_dir),
        "AENV_HOST": cfg.host,
        "AENV_PORT": str(cfg.port),
        "AENV_NATS_URL": services["nats_url"],
        "AENV_DATABASE_URL": services["database_url"],
    }
    env.pop("AENV_LOG_FILE", None)  # the supervisor's file: roles write to it through it
    env["AENV_METRICS_TOKEN"] = _metrics_token(cfg)
    s3 = services.get("s3")
    if s3:
        env.update(
            {
                "AENV_S3_ENDPOINT": s3["url"],
                "AENV_S3_ACCESS_KEY": s3["access_key"] or "",
                "AENV_S3_SECRET_KEY": s3["secret_key"] or "",
            }
        )
    else:
        env.pop("AENV_S3_ENDPOINT", None)
    return env


def _metrics_token(cfg: StackSettings) -> str:
    """What Prometheus scrapes both roles' `/metrics` with: the operator's
    (`AENV_METRICS_TOKEN`), else minted once and kept (0600) in the data dir and in
    stack.json (`metrics_token`)."""
    given = os.environ.get("AENV_METRICS_TOKEN")
    if given:
        return given
    path = cfg.data_dir / "metrics-token"
    if not path.exists():
        write_private(path, secrets.token_urlsafe(24) + "\n")
    return path.read_text().strip()


def _dump_tasks() -> None:
    """SIGUSR1: print every asyncio task's stack (where is a stuck start-up waiting?)."""
    for task in asyncio.all_tasks():
        print(f"--- {task.get_name()}", file=sys.stderr)
        task.print_stack(limit=12, file=sys.stderr)
    sys.stderr.flush()


ROLES = ("all", "node", "api")


#: What a node's deadline holds after its drains: destroying its VMs and their network
#: namespaces. Without it a drain that took its whole `AENV_DRAIN_S` left no time for
#: them, the deadline's SIGALRM ended the node mid-teardown and its namespaces stayed
#: until its next start swept them (the fleet test under two CPU hogs: 4-28 left).
NODE_TEARDOWN_S = 15.0


def stop_deadline_s(role: str, cfg: RoleSettings) -> float:
    """How long a role may take to stop after SIGTERM: its drain of in-flight work, a
    node's drain by pause before it (`AENV_STOP_DRAIN=pause`) and its teardown after."""
    if role != "node":
        return cfg.drain_s
    pause = cfg.stop_drain_s if cfg.stop_drain == "pause" else 0.0
    return cfg.drain_s + pause + NODE_TEARDOWN_S


def main(role: str | None = None) -> None:
    """Run `role` in the foreground until SIGTERM: `all` supervises a whole stack (what
    `aenv up` starts), `node` and `api` run one role alone — a fleet's machines, each
    under its own supervisor (systemd, Kubernetes), every connection from `AENV_*`."""
    if role is None:
        role = sys.argv[1] if len(sys.argv) > 1 else "all"
    service = "aenv" if role == "all" else f"aenv-{role}"
    stack_log = None
    if role == "all" and (cfg := StackSettings()).log_file is not None:
        stack_log = StackLog(
            cfg.log_file, max_bytes=int(cfg.log_max_mb * 2**20), backups=cfg.log_backups
        )
    logs.configure(service)
    try:
        _main(role, service)
    finally:
        if stack_log is not None:
            stack_log.close()


def _main(role: str, service: str) -> None:
    # What the stack writes is its own: stack.json, credentials, logs, the servers' data.
    # Not the node's: it builds guest file systems, whose implicitly made dirs must keep
    # the usual 0755 (a guest user could not enter a 0700 one); its files sit in the
    # data dir, which no other user may enter.
    os.umask(0o022 if role == "node" else 0o077)
    if role not in ROLES:
        raise SystemExit(f"usage: aenv serve --role {'|'.join(ROLES)} (got {role!r})")
    setup_tracing(service)
    log.info("event loop: %s", eventloop.loop_name())
    report_unknown(os.environ)  # a misspelt AENV_* name is otherwise ignored without a word

    gave_up: list[str] = []

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal(sig: signal.Signals) -> None:
            stop.set()
            if role != "all":  # SIGALRM's default action ends the process: the deadline
                signal.alarm(max(1, round(stop_deadline_s(role, RoleSettings()))))
            say(f"received {sig.name}")  # last: nothing here may keep the stop from happening

        def on_give_up(task: str, error: BaseException) -> None:
            """A background task kept dying (`bus.supervised`): the role drains and exits
            non-zero, and its supervisor starts it afresh."""
            gave_up.append(task)
            stop.set()
            signal.alarm(max(1, round(stop_deadline_s(role, RoleSettings()))))
            say(f"task {task} keeps dying ({error!r}); stopping the role (exit {TASK_DIED})")

        if role != "all":
            supervised.on_give_up(on_give_up)

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
        loop.add_signal_handler(signal.SIGUSR1, _dump_tasks)
        # each process imports its own role's code only (the API's ~1.8 s of imports, the
        # node's ~0.6 s): the supervisor none, so a stack's three processes start sooner
        if role == "node":
            from aenv.roles.node import run_node

            await start_again(lambda: run_node(RoleSettings(), stop), stop)
        elif role == "api":
            from aenv.roles.api import run_api

            await start_again(lambda: run_api(RoleSettings(), stop), stop)
        else:
            await serve(StackSettings(), stop)

    try:
        eventloop.run(run())
    except (ReplicasMismatch, LimitsMismatch) as e:  # the operator's to fix: one line
        log.error("refusing to start: %s", e)
        raise SystemExit(EXIT_CONFIG) from None
    if gave_up:
        raise SystemExit(TASK_DIED)


if __name__ == "__main__":
    main()
