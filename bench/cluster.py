"""A real 3-server NATS JetStream cluster on this machine, for the cluster and fleet tests
and the fleet benchmarks.

Each server has its own client, route and monitoring ports (free ones, never 4222) and its
own store; clients log in with a user and password. `kill(i)` is a kill -9, `start(i)`
brings that server back on the same ports and store, and `wait_healthy()` waits until
every running server says JetStream is current (`/healthz?js-enabled-only=true` would not
say whether its streams caught up; plain `/healthz` does).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from aenv.stack.process import free_port

NATS_SERVER = str(Path(sys.executable).parent / "nats-server")


@dataclass
class _Server:
    name: str
    client: int
    route: int
    monitor: int
    store: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None


@dataclass
class NatsCluster:
    root: Path
    size: int = 3
    user: str = "aenv"
    password: str = field(default_factory=lambda: secrets.token_hex(12))
    servers: list[_Server] = field(default_factory=list)

    def __post_init__(self) -> None:
        for i in range(self.size):
            d = self.root / f"n{i}"
            d.mkdir(parents=True, exist_ok=True)
            self.servers.append(
                _Server(f"n{i}", free_port(), free_port(), free_port(), d / "js", d / "nats.log")
            )

    @property
    def url(self) -> str:
        """Every server, comma-separated: what `AENV_NATS_URL` takes."""
        return ",".join(self.server_url(i) for i in range(self.size))

    def server_url(self, i: int) -> str:
        return f"nats://{self.user}:{self.password}@127.0.0.1:{self.servers[i].client}"

    def _config(self, s: _Server) -> str:
        others = [o for o in self.servers if o is not s]
        routes = ", ".join(f'"nats-route://127.0.0.1:{o.route}"' for o in others)
        return (
            f'server_name: "{s.name}"\nlisten: "127.0.0.1:{s.client}"\n'
            f'http: "127.0.0.1:{s.monitor}"\n'
            f'authorization {{ user: "{self.user}", password: "{self.password}" }}\n'
            f'jetstream {{ store_dir: "{s.store}", max_memory_store: 256MB, '
            f"max_file_store: 4GB }}\n"
            f'cluster {{ name: "aenvtest", listen: "127.0.0.1:{s.route}", '
            f"routes: [{routes}] }}\n"
        )

    def start(self, i: int | None = None) -> None:
        """Start server `i` (all when None) on its ports and store."""
        for s in self.servers if i is None else [self.servers[i]]:
            if s.proc is not None and s.proc.poll() is None:
                continue
            conf = s.store.parent / "nats.conf"
            conf.write_text(self._config(s))
            os.chmod(conf, 0o600)
            with open(s.log, "ab") as out:
                s.proc = subprocess.Popen(
                    [NATS_SERVER, "-c", str(conf)], stdout=out, stderr=subprocess.STDOUT
                )

    def kill(self, i: int) -> None:
        """kill -9 of server `i`."""
        proc = self.servers[i].proc
        assert proc is not None
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def running(self, i: int) -> bool:
        proc = self.servers[i].proc
        return proc is not None and proc.poll() is None

    def healthy(self, i: int) -> bool:
        try:
            r = httpx.get(f"http://127.0.0.1:{self.servers[i].monitor}/healthz", timeout=2)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    def wait_healthy(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self.healthy(i) for i in range(self.size) if self.running(i)):
                return
            time.sleep(0.2)
        bad = [
            s.name for i, s in enumerate(self.servers) if self.running(i) and not self.healthy(i)
        ]
        raise AssertionError(f"NATS servers not healthy after {timeout:.0f} s: {bad}")

    def leader_of(self, stream: str) -> int:
        """Which server leads `stream` now (from the first healthy server's /jsz)."""
        for i in range(self.size):
            if not self.running(i):
                continue
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                r = httpx.get(
                    f"http://127.0.0.1:{self.servers[i].monitor}/jsz",
                    params={"streams": "true"},
                    timeout=2,
                )
                for account in r.json().get("account_details", []):
                    for st in account.get("stream_detail", []):
                        if st["name"] == stream:
                            leader = st["cluster"]["leader"]
                            return next(j for j, s in enumerate(self.servers) if s.name == leader)
        raise AssertionError(f"no leader known for {stream}")

    def index_of_port(self, port: int | None) -> int | None:
        return next((i for i, s in enumerate(self.servers) if s.client == port), None)

    def stop(self) -> None:
        for s in self.servers:
            if s.proc is not None and s.proc.poll() is None:
                s.proc.terminate()
                try:
                    s.proc.wait(15)
                except subprocess.TimeoutExpired:
                    s.proc.kill()
                    s.proc.wait(5)
