"""The VM-less tier: the real stack — `aenv up`'s supervisor, API, projections, timer,
builder and node worker processes, talking over the machine's real NATS JetStream and
Postgres — with the node's `Host` port served in memory (`AENV_NODE_HOST=memory`, no QEMU,
no root). It checks the control plane end to end in seconds; the VM tiers check the VMs.

Each session gets a bus namespace (`t<hex>`, swept like the other tiers' when a killed
session leaves it) and a database of its own, both removed at the end."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx
import pytest

from aenv.cli import read_exports
from aenv.stack.process import free_port
from bus import Bus, BusSettings, delete_all
from tests.vmstack import TLS_ENV

AENV = [sys.executable, "-m", "aenv.cli"]
NATS_URL = "nats://127.0.0.1:4222"
PG = "postgresql://postgres@127.0.0.1:5432"
#: What Prometheus would scrape /metrics with (`AENV_METRICS_TOKEN`)
METRICS_TOKEN = "vmless-metrics-" + secrets.token_hex(8)


@dataclass(frozen=True)
class VmlessStack:
    data_dir: Path
    api_url: str
    api_key: str
    env: dict[str, str]
    bus_settings: BusSettings
    #: what `aenv up` prints for clients over HTTPS by name (`E2B_DOMAIN`, `SSL_CERT_FILE`,
    #: `NODE_EXTRA_CA_CERTS`): empty with `AENV_TLS_PORT=0`
    tls_env: dict[str, str] = field(default_factory=dict)

    def client(self, timeout: float = 30) -> httpx.Client:
        """The API over plain HTTP, with this stack's key."""
        return httpx.Client(
            base_url=self.api_url, headers={"X-API-KEY": self.api_key}, timeout=timeout
        )

    def aenv(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """The CLI against this stack."""
        return subprocess.run(
            [*AENV, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**self.env, "E2B_API_URL": self.api_url, "E2B_API_KEY": self.api_key},
        )


async def _database(sql: str) -> None:
    admin = await asyncpg.connect(f"{PG}/postgres")
    try:
        await admin.execute(sql)
    finally:
        await admin.close()


async def _delete_namespace(settings: BusSettings) -> None:
    bus = await Bus.connect(settings, setup=False)
    try:
        await delete_all(bus.js, settings)
    finally:
        await bus.close()


@contextmanager
def vmless_stack(data: Path, **extra_env: str) -> Iterator[VmlessStack]:
    """`aenv up` on `data` (its own database and bus namespace) until the block ends, then
    `aenv down`. `extra_env` reaches the supervisor: `AENV_NATS_URL=""` and
    `AENV_DATABASE_URL=""` make it embed NATS and Postgres instead of the machine's."""
    token = secrets.token_hex(4)
    db = f"aenv_test_{token}"  # swept by the projections tier if a killed session leaves it
    prefix = f"t{token}"
    asyncio.run(_database(f'CREATE DATABASE "{db}"'))
    env = {
        **os.environ,
        "AENV_NODE_HOST": "memory",
        "AENV_NODE_ID": "vmless",
        "AENV_NATS_URL": NATS_URL,
        "AENV_BUS_PREFIX": prefix,
        "AENV_DATABASE_URL": f"{PG}/{db}",
        "AENV_EMBEDDED_S3": "0",
        "AENV_HEARTBEAT_S": "0.5",
        "AENV_METRICS_TOKEN": METRICS_TOKEN,
        "AENV_TLS_PORT": str(free_port()),  # kept for an `aenv up` again of a test
        **extra_env,
    }
    for k in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_VOLUME_API_URL", "E2B_API_KEY"):
        env.pop(k, None)
    for k in [k for k, v in env.items() if k.startswith("AENV_") and v == ""]:
        env.pop(k)
    settings = BusSettings(nats_url=NATS_URL, bus_prefix=prefix)
    try:
        up = subprocess.run(
            [*AENV, "up", "--data-dir", str(data), "--port", str(free_port())],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        if up.returncode != 0:
            log = (data / "aenv.log").read_text(errors="replace")[-4000:]
            pytest.fail(f"aenv up failed ({up.returncode}): {up.stderr[-2000:]}\n{log}")
        exports = read_exports(up.stdout)
        try:
            tls = {k: exports[k] for k in TLS_ENV if k in exports}
            yield VmlessStack(
                data, exports["E2B_API_URL"], exports["E2B_API_KEY"], env, settings, tls
            )
        finally:
            # `aenv down` SIGKILLs what has not drained after its --timeout (60 s); the
            # wait here is longer, so a slow drain on a loaded host ends in its SIGKILL
            # rather than in this test's timeout with the stack left running
            down = subprocess.run(
                [*AENV, "down", "--data-dir", str(data), "--timeout", "60"],
                capture_output=True,
                text=True,
                timeout=120,
                env=env,
            )
            assert down.returncode == 0, down.stderr
    finally:
        asyncio.run(_database(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))
        if "AENV_NATS_URL" in env:
            asyncio.run(_delete_namespace(settings))


@pytest.fixture(scope="package")
def vmless(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VmlessStack]:
    with vmless_stack(tmp_path_factory.mktemp("aenv-vmless")) as stack:
        yield stack


@pytest.fixture
def sdk_env(vmless: VmlessStack, monkeypatch: pytest.MonkeyPatch) -> None:
    """The unchanged E2B SDK (its sandboxes and volumes), pointed at this stack."""
    monkeypatch.setenv("E2B_API_URL", vmless.api_url)
    monkeypatch.setenv("E2B_SANDBOX_URL", vmless.api_url)
    monkeypatch.setenv("E2B_VOLUME_API_URL", vmless.api_url)
    monkeypatch.setenv("E2B_API_KEY", vmless.api_key)
