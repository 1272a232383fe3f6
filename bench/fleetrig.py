"""A fleet of real aenv role processes on this one machine, for the fleet test and the fleet
benchmark: a 3-server NATS JetStream cluster (R3), the machine's Postgres (a database of its
own), one SeaweedFS, API processes and node processes started as a fleet's machines start
them (`aenv serve --role api|node`, every connection from `AENV_*`, each node its own id,
slot prefix and range, state dir). The caller is their supervisor: it kills and starts
them itself."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx

from aenv.logformat import marks
from aenv.stack import EmbeddedS3
from aenv.stack.process import die_with_parent, free_port
from bench.cluster import NatsCluster

__all__ = ["NODES", "Fleet", "RigError", "Role", "fleet_rig", "stop_all"]

PG = "postgresql://postgres@127.0.0.1:5432"
AENV = [sys.executable, "-m", "aenv.cli"]
#: node ids, slot prefixes (letters only) and slot ranges, apart from other stacks'
NODES = (
    ("fleet-a", "flta", "10.221.0.0/16"),
    ("fleet-b", "fltb", "10.222.0.0/16"),
    ("fleet-c", "fltc", "10.223.0.0/16"),
)


class RigError(Exception):
    """A role would not start or stop."""


@dataclass
class Role:
    name: str
    kind: str  # api | node
    data_dir: Path
    env: dict[str, str]
    port: int
    proc: subprocess.Popen[bytes] | None = None
    _readies: int = 0

    @property
    def log(self) -> Path:
        return self.data_dir / "role.log"

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [*AENV, "serve", "--role", self.kind, "--data-dir", str(self.data_dir)],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent(os.getpid()),
            )

    def wait_ready(self, timeout: float = 600) -> None:
        """Until it prints one more ROLE-READY than it had (a restart's)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RigError(f"{self.name} exited ({self.proc.returncode}):\n{self.tail()}")
            if (n := self._ready_lines()) > self._readies:
                self._readies = n
                return
            time.sleep(0.2)
        raise RigError(f"{self.name} not ready after {timeout:.0f} s:\n{self.tail()}")

    def _ready_lines(self) -> int:
        if not self.log.exists():
            return 0
        return sum(
            1 for ln in self.log.read_text(errors="replace").splitlines() if marks(ln, "ROLE-READY")
        )

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        stop_all([self])

    def tail(self, n: int = 60) -> str:
        text = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return "\n".join([ln for ln in text if '"qemu.qmp.' not in ln][-n:])


@dataclass
class Fleet:
    root: Path
    nats: NatsCluster
    database_url: str
    api_key: str
    apis: list[Role] = field(default_factory=list)
    nodes: list[Role] = field(default_factory=list)

    def api_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.apis[i].port}"

    def sdk(self, i: int) -> dict[str, str]:
        """The unchanged SDK's options to reach the fleet through API `i`."""
        url = self.api_url(i)
        return {"api_url": url, "sandbox_url": url, "api_key": self.api_key}

    def operator_env(self) -> dict[str, str]:
        """What an operator's shell on a fleet machine holds (its roles' env file)."""
        return {
            **os.environ,
            "AENV_NATS_URL": self.nats.url,
            "AENV_DATABASE_URL": self.database_url,
            "AENV_REPLICAS": "3",
        }

    def aenv(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*AENV, *args, "--data-dir", str(self.root / "operator")],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.operator_env(),
        )

    def capture_key(self, ref: str) -> str | None:
        """The repository key of the capture a create of template `ref` restores (its
        `default` build's, for a built or pulled template), once the log says it is
        uploaded: from then on any node can fetch it."""
        from bus import Bus, BusSettings

        async def read() -> str | None:
            bus = await Bus.connect(BusSettings(nats_url=self.nats.url), setup=False)
            try:
                tpl, _ = await bus.templates.load(ref)
                capture = tpl.capture_for("default") if tpl is not None else None
                if tpl is not None and capture is not None and capture != ref:
                    tpl, _ = await bus.templates.load(capture)
                return tpl.capture_key if tpl is not None else None
            finally:
                await bus.close()

        return asyncio.run(read())

    def api_ok(self, i: int) -> bool:
        try:
            return httpx.get(f"{self.api_url(i)}/health/live", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False


def stop_all(roles: list[Role], timeout: float = 60) -> None:
    """SIGTERM every live role at once, then wait for each (a role still running `timeout`
    s after its signal is SIGKILLed): each drains as it would alone, and the rig's teardown
    takes the slowest role's drain instead of the sum of them (a rig of 2 APIs and 3 nodes:
    26 s one after another, 15 s at once; the fleet tier tears down three rigs)."""
    live = [r.proc for r in roles if r.proc is not None and r.proc.poll() is None]
    for proc in live:
        proc.terminate()
    deadline = time.monotonic() + timeout
    for proc in live:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _common_env(
    nats: NatsCluster, s3: dict[str, str], api_key: str, extra: dict[str, str]
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AENV_", "E2B_"))}
    env.update(
        {
            "AENV_NATS_URL": nats.url,
            "AENV_REPLICAS": "3",
            "AENV_S3_ENDPOINT": s3["url"],
            "AENV_S3_ACCESS_KEY": s3["access_key"],
            "AENV_S3_SECRET_KEY": s3["secret_key"],
            "AENV_PROXY_VIA_NODE": "1",
            "AENV_API_KEY": api_key,
            "AENV_UPLOAD_SECRET": secrets.token_hex(16),
            "AENV_DRAIN_S": "10",
            **extra,
        }
    )
    return env


async def _sql(sql: str) -> None:
    conn = await asyncpg.connect(f"{PG}/postgres")
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@contextlib.contextmanager
def fleet_rig(
    root: Path,
    *,
    apis: int = 2,
    nodes: int = 3,
    env: dict[str, str] | None = None,
    tag: str = "",
    node_env: dict[str, dict[str, str]] | None = None,
    started: int | None = None,
) -> Iterator[Fleet]:
    """The fleet, started (the first node builds or finds the guest image before the
    others start), until the block ends; then every process stopped and the database
    dropped. Raises `RigError` with the role's log when one does not come up. `tag` ends
    the nodes' slot prefixes, so two rigs on one machine keep their namespaces apart.
    `node_env`: settings of one node (by id) over `env`; `started`: how many nodes start
    with the rig (default all; the test starts the others, `Role.start`)."""
    db = f"aenv_fleet_{secrets.token_hex(4)}"
    asyncio.run(_sql(f'CREATE DATABASE "{db}"'))
    nats = NatsCluster(root / "nats")
    s3 = EmbeddedS3(root / "s3")
    api_key = "e2b_" + secrets.token_hex(20)
    fleet = Fleet(root, nats, f"postgresql+asyncpg://postgres@127.0.0.1:5432/{db}", api_key)
    try:
        nats.start()
        nats.wait_healthy()
        ep = asyncio.run(s3.start())
        common = _common_env(
            nats,
            {"url": ep.url, "access_key": ep.access_key, "secret_key": ep.secret_key},
            api_key,
            env or {},
        )
        for i in range(apis):
            port = free_port()
            fleet.apis.append(
                Role(
                    f"api-{i}",
                    "api",
                    root / f"api-{i}",
                    {
                        **common,
                        "AENV_HOST": "127.0.0.1",
                        "AENV_PORT": str(port),
                        "AENV_DATABASE_URL": fleet.database_url,
                    },
                    port,
                )
            )
        for node_id, prefix, cidr in NODES[:nodes]:
            port = free_port()
            fleet.nodes.append(
                Role(
                    node_id,
                    "node",
                    root / node_id,
                    {
                        **common,
                        "AENV_NODE_ID": node_id,
                        "AENV_SLOT_PREFIX": prefix + tag,
                        "AENV_SLOT_CIDR": cidr,
                        "AENV_SLOT_POOL": "4",
                        "AENV_PROXY_HOST": "127.0.0.1",
                        "AENV_PROXY_PORT": str(port),
                        "AENV_CAPACITY": "24",
                        **(node_env or {}).get(node_id, {}),
                    },
                    port,
                )
            )
        fleet.nodes[0].start()
        fleet.nodes[0].wait_ready()
        rest = [*fleet.nodes[1 : nodes if started is None else started], *fleet.apis]
        for role in rest:
            role.start()
        for role in rest:
            role.wait_ready()
        yield fleet
    finally:
        stop_all([*fleet.apis, *fleet.nodes])
        asyncio.run(s3.stop())
        nats.stop()
        asyncio.run(_sql(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))
