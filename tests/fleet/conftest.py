"""A fleet on this one machine, started the way docs/deploy.md starts one on three: a
3-server NATS JetStream cluster (its own ports and stores, R3 streams), one Postgres (the
machine's, a database of its own), one SeaweedFS, two API processes and three node
processes (`aenv serve --role api|node`, every connection from `AENV_*`, each node its own
id, slot prefix and range, state dir). The test is their supervisor: it kills and starts
them itself. Size: `AENV_FLEET_N` sandboxes (CI runs the default, a reduced size;
`AENV_FLEET_N=30 pytest tests/fleet -s` for the full run)."""

from __future__ import annotations

import asyncio
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
import pytest

from aenv.stack import EmbeddedS3
from aenv.stack.process import die_with_parent, free_port
from bench.cluster import NatsCluster

pytestmark = [pytest.mark.vm, pytest.mark.fleet]

SIZE = int(os.environ.get("AENV_FLEET_N", "12"))
PG = "postgresql://postgres@127.0.0.1:5432"
AENV = [sys.executable, "-m", "aenv.cli"]
#: slot prefixes of the three nodes (letters only) and their ranges (apart from other stacks')
NODES = (("fleet-a", "flta", "10.221.0.0/16"), ("fleet-b", "fltb", "10.222.0.0/16"),
         ("fleet-c", "fltc", "10.223.0.0/16"))  # fmt: skip


@dataclass
class Role:
    name: str
    kind: str  # api | node
    data_dir: Path
    env: dict[str, str]
    port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.data_dir / "role.log"

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        out = open(self.log, "ab")  # noqa: SIM115 (the child holds it)
        self.proc = subprocess.Popen(
            [*AENV, "serve", "--role", self.kind, "--data-dir", str(self.data_dir)],
            env=self.env, stdout=out, stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent(os.getpid()),
        )  # fmt: skip
        out.close()

    def wait_ready(self, timeout: float = 600) -> None:
        """Until it prints one more ROLE-READY than it had (a restart's)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                pytest.fail(f"{self.name} exited ({self.proc.returncode}):\n{self.tail()}")
            if self._ready_lines() > self._readies:
                self._readies = self._ready_lines()
                return
            time.sleep(0.2)
        pytest.fail(f"{self.name} not ready after {timeout:.0f} s:\n{self.tail()}")

    _readies: int = 0

    def _ready_lines(self) -> int:
        if not self.log.exists():
            return 0
        return sum(1 for ln in self.log.read_text(errors="replace").splitlines()
                   if ln.strip() == "ROLE-READY")  # fmt: skip

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

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
        return {**os.environ, "AENV_NATS_URL": self.nats.url,
                "AENV_DATABASE_URL": self.database_url, "AENV_REPLICAS": "3"}  # fmt: skip

    def aenv(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*AENV, *args, "--data-dir", str(self.root / "operator")],
                              capture_output=True, text=True, timeout=timeout,
                              env=self.operator_env())  # fmt: skip

    def api_ok(self, i: int) -> bool:
        try:
            return httpx.get(f"{self.api_url(i)}/health/live", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False


def _common_env(nats: NatsCluster, s3: dict[str, str], api_key: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AENV_", "E2B_"))}
    env.update({
        "AENV_NATS_URL": nats.url, "AENV_REPLICAS": "3", "AENV_HEARTBEAT_S": "1",
        "AENV_NODE_LOST_AFTER_S": "15", "AENV_S3_ENDPOINT": s3["url"],
        "AENV_S3_ACCESS_KEY": s3["access_key"], "AENV_S3_SECRET_KEY": s3["secret_key"],
        "AENV_PROXY_VIA_NODE": "1", "AENV_API_KEY": api_key,
        "AENV_UPLOAD_SECRET": secrets.token_hex(16), "AENV_DRAIN_S": "10",
    })  # fmt: skip
    return env


async def _sql(sql: str) -> None:
    conn = await asyncpg.connect(f"{PG}/postgres")
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture(scope="package")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    if os.geteuid() != 0:
        pytest.skip("the fleet runs microVMs: needs root")
    root = Path(tmp_path_factory.mktemp("aenv-fleet"))
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
        env = _common_env(nats, {"url": ep.url, "access_key": ep.access_key,
                                 "secret_key": ep.secret_key}, api_key)  # fmt: skip
        for i in range(2):
            port = free_port()
            fleet.apis.append(Role(f"api-{i}", "api", root / f"api-{i}", {
                **env, "AENV_HOST": "127.0.0.1", "AENV_PORT": str(port),
                "AENV_DATABASE_URL": fleet.database_url}, port))  # fmt: skip
        for node_id, prefix, cidr in NODES:
            port = free_port()
            fleet.nodes.append(Role(node_id, "node", root / node_id, {
                **env, "AENV_NODE_ID": node_id, "AENV_SLOT_PREFIX": prefix,
                "AENV_SLOT_CIDR": cidr, "AENV_SLOT_POOL": "4", "AENV_PROXY_HOST": "127.0.0.1",
                "AENV_PROXY_PORT": str(port), "AENV_CAPACITY": "24"}, port))  # fmt: skip
        # the first node builds (or finds) the guest image; the others then find it cached
        fleet.nodes[0].start()
        fleet.nodes[0].wait_ready()
        for role in [*fleet.nodes[1:], *fleet.apis]:
            role.start()
        for role in [*fleet.nodes[1:], *fleet.apis]:
            role.wait_ready()
        yield fleet
    finally:
        for role in [*fleet.apis, *fleet.nodes]:
            role.stop()
        asyncio.run(s3.stop())
        nats.stop()
        asyncio.run(_sql(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))
        from workers.node.net import list_leftovers

        left = [ns for _, prefix, _ in NODES for ns in list_leftovers(prefix)]
        assert left == [], f"network namespaces left behind: {left}"
        procs = subprocess.run(["pgrep", "-af", str(root)], capture_output=True, text=True)
        assert procs.stdout.strip() == "", f"processes left behind: {procs.stdout}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    f = getattr(item, "funcargs", {}).get("fleet")
    if report.failed and isinstance(f, Fleet):
        for role in [*f.apis, *f.nodes]:
            report.sections.append((f"{role.name} (tail)", role.tail(80)))
