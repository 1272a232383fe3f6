"""Health that tells the truth, against a real stack: S3 unreachable, Postgres hung
(SIGSTOP: a server that hangs does not refuse), the node role frozen — each makes
readiness, `/health` and `aenv status` fail and name it; liveness stays 200."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import httpx
import pytest

from aenv.stack.process import free_port
from bus import Bus
from bus.nodes import Heartbeat, NodeBook
from tests.vmless.conftest import VmlessStack, vmless_stack
from tests.vmless_slow.test_supervision import eventually, role_pid


class _S3Gateway(BaseHTTPRequestHandler):
    """Stands in for an S3 gateway: an unsigned request gets 403, as from SeaweedFS."""

    def do_GET(self) -> None:
        self.send_response(403)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


class _S3Port:
    """The fake gateway's port, held for the module: bound but not listening (connections
    refused: S3 down) while no gateway serves it, so no server of the stacks other tests
    start meanwhile can take it."""

    def __init__(self) -> None:
        self.port = free_port()
        self._hold: socket.socket | None = None
        self.hold()

    def hold(self) -> None:
        self._hold = socket.socket()
        self._hold.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._hold.bind(("127.0.0.1", self.port))

    def release(self) -> None:
        if self._hold is not None:
            self._hold.close()
            self._hold = None


@pytest.fixture(scope="module")
def s3_port() -> Iterator[_S3Port]:
    port = _S3Port()
    yield port
    port.release()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, s3_port: _S3Port) -> Iterator[VmlessStack]:
    with vmless_stack(
        tmp_path_factory.mktemp("aenv-health"),
        AENV_DATABASE_URL="",
        AENV_S3_ENDPOINT=f"http://127.0.0.1:{s3_port.port}",
    ) as s:
        yield s


def _ready(stack: VmlessStack) -> httpx.Response:
    return httpx.get(f"{stack.api_url}/health/ready", timeout=10)


def _down(stack: VmlessStack, what: str) -> Callable[[], bool]:
    def check() -> bool:
        r = _ready(stack)
        return r.status_code == 503 and what in r.json()["message"]

    return check


@pytest.fixture
def s3_up(s3_port: _S3Port) -> Iterator[None]:
    s3_port.release()
    server = HTTPServer(("127.0.0.1", s3_port.port), _S3Gateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        s3_port.hold()


def test_s3_down_is_not_ready_and_says_so(stack: VmlessStack) -> None:
    plain = httpx.get(f"{stack.api_url}/health", timeout=10)  # was 200 "ok" with S3 down
    assert plain.status_code == 503 and "s3:" in plain.json()["message"], plain.text
    r = _ready(stack)
    assert r.status_code == 503, r.text
    body = r.json()
    assert body["code"] == 503 and "s3:" in body["message"], body
    assert body["checks"]["postgres"] == "ok" and body["checks"]["nats"] == "ok"
    assert httpx.get(f"{stack.api_url}/health/live", timeout=10).status_code == 200
    status = stack.aenv("status", "--data-dir", str(stack.data_dir))
    assert status.returncode != 0 and "s3:" in status.stderr, status.stdout + status.stderr


def test_everything_up_is_ready_with_the_old_success_body(stack: VmlessStack, s3_up: None) -> None:
    r = _ready(stack)
    assert r.status_code == 200, r.text
    plain = httpx.get(f"{stack.api_url}/health", timeout=10)
    assert plain.status_code == 200 and plain.json()["status"] == "ok"
    status = stack.aenv("status", "--data-dir", str(stack.data_dir))
    assert status.returncode == 0, status.stdout + status.stderr


def _children(pid: int) -> list[int]:
    out = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and f"PPid:\t{pid}\n" in (proc / "status").read_text():
                out.append(int(proc.name))
        except OSError:
            continue
    return out


def _freeze(pid: int, *, children: bool = False) -> Iterator[None]:
    pids = [pid, *(_children(pid) if children else [])]
    for p in pids:
        os.kill(p, signal.SIGSTOP)
    try:
        yield
    finally:
        for p in pids:
            os.kill(p, signal.SIGCONT)


def test_a_hung_postgres_is_named(stack: VmlessStack, s3_up: None) -> None:
    pidfile = stack.data_dir / "services/postgres/data/postmaster.pid"
    postmaster = int(Path(pidfile).read_text().split()[0])
    # its backends too (each in a session of its own): the pool's connections
    for _ in _freeze(postmaster, children=True):
        eventually(_down(stack, "postgres:"), 15, "readiness names postgres")
    eventually(lambda: _ready(stack).status_code == 200, 30, "ready again")


def test_a_node_that_stopped_beating_is_named(stack: VmlessStack, s3_up: None) -> None:
    for _ in _freeze(role_pid(stack, "node")):
        eventually(_down(stack, "node: no node is beating"), 15, "readiness names the node")
    eventually(lambda: _ready(stack).status_code == 200, 30, "ready again")


def _beat(stack: VmlessStack, waiting: int) -> None:
    """A node's heartbeat as the node role writes it, with its failed-upload backlog."""

    async def put() -> None:
        bus = await Bus.connect(stack.bus_settings, setup=False)
        try:
            book = await NodeBook.open(bus.js, bus.names.nodes_bucket)
            await book.beat(
                Heartbeat(
                    node_id="uploader",
                    at=time.time(),
                    every_s=60,
                    uploads_waiting=waiting,
                    oldest_upload_wait_s=42.0 if waiting else 0.0,
                )
            )
        finally:
            await bus.close()

    asyncio.run(put())


def test_captures_waiting_for_upload_are_named(stack: VmlessStack, s3_up: None) -> None:
    """A pause whose upload keeps failing is not durable: readiness (still 200: the API
    serves) and `aenv status` (exit 3) say how many wait and for how long."""
    _beat(stack, 3)
    try:
        line = "3 captures waiting for upload, oldest 42 s on node uploader"

        def warned() -> bool:
            r = _ready(stack)
            return r.status_code == 200 and r.json()["warnings"].get("uploads") == line

        eventually(warned, 15, "readiness names the upload backlog")
        status = stack.aenv("status", "--data-dir", str(stack.data_dir))
        assert status.returncode == 3 and f"uploads: {line}" in status.stderr, status.stderr
    finally:
        _beat(stack, 0)
    eventually(lambda: not _ready(stack).json()["warnings"], 15, "no warning once uploaded")
    assert stack.aenv("status", "--data-dir", str(stack.data_dir)).returncode == 0
