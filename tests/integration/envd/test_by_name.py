"""envd by name over HTTPS, without a VM: the unchanged SDK (in a process of its own, no
`E2B_SANDBOX_URL`, only the domain and the CA bundle) talks to `https://49983-{id}.{domain}`
— connectrpc streams over the SDK's Rust transport, `/files` over httpx — through the real
sandbox proxy served with a certificate of `aenv up`'s local CA, to a real envd process on
the host; `get_host(port)` reaches a stand-in guest server the same way. Names resolve
through this machine's `*.localhost` (scripts/setup.sh). The e2e tier does the same with a
VM and the whole stack (`tests/e2e/test_domain.py`)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from aenv.tls import local_certificate
from shared.proxy import Receive, SandboxProxy, Scope, Send, Upstream
from tests.integration.bus.test_proxy_ingress import Guest, serving
from tests.integration.envd.conftest import Envd, init_envd, start_envd, stop_envd
from workers.node.proxy import listen

SID = "envdbyname"

SCRIPT = """
import json, sys
import httpx
from e2b import Sandbox
from e2b.connection_config import ConnectionConfig
from packaging.version import Version

domain, token, version = sys.argv[1:4]
sbx = Sandbox(
    sandbox_id="envdbyname",
    sandbox_domain=domain,
    envd_version=Version(version),
    envd_access_token=token,
    traffic_access_token=None,
    connection_config=ConnectionConfig(
        domain=domain, api_key="unused", extra_sandbox_headers={"X-Access-Token": token}
    ),  # as `Sandbox.create` builds it from the create's answer
)
out = {"envd_url": sbx.envd_api_url}
out["echo"] = sbx.commands.run("echo streamed over https").stdout
sbx.files.write("/tmp/aenv-by-name.txt", "written over https")
out["read"] = sbx.files.read("/tmp/aenv-by-name.txt")
out["guest"] = httpx.get(f"https://{sbx.get_host(8000)}/hello", timeout=10).json()
print(json.dumps(out))
"""


@pytest.fixture
def own_envd(test_user: str) -> Iterator[Envd]:
    e = start_envd("--default-user", test_user)
    init_envd(e, "tok-by-name")
    yield e
    stop_envd(e)


async def _not_api(scope: Scope, receive: Receive, send: Send) -> None:
    raise AssertionError("every request here is sandbox traffic")


async def test_the_sdk_reaches_envd_by_name_over_https(own_envd: Envd, tmp_path: Path) -> None:
    sock = listen("127.0.0.1", 0)
    domain = f"aenv.localhost:{sock.getsockname()[1]}"
    try:
        socket.getaddrinfo(f"49983-{SID}.aenv.localhost", None)
    except OSError:
        pytest.fail("*.localhost does not resolve on this machine: run scripts/setup.sh")
    ca = local_certificate(tmp_path / "tls", domain)
    guest = Guest()
    guest_sock = listen("127.0.0.1", 0)
    guest_port = guest_sock.getsockname()[1]

    async def resolve(sandbox_id: str, port: int, _token: str | None) -> Upstream:
        assert sandbox_id == SID
        return Upstream("127.0.0.1", own_envd.port if port == 49983 else guest_port)

    proxy = SandboxProxy(_not_api, resolve, domain=domain)
    cert = {"ssl_certfile": ca.certificate.cert_file, "ssl_keyfile": ca.certificate.key_file}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("E2B_", "AENV_"))}
    env.pop("SSL_CERT_DIR", None)
    env["SSL_CERT_FILE"] = str(ca.bundle_file)
    from envd.version import ENVD_VERSION

    assert own_envd.token is not None
    async with serving(guest, guest_sock), serving(proxy, sock, **cert):
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            SCRIPT,
            domain,
            own_envd.token,
            ENVD_VERSION,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()[-3000:]
    got = json.loads(out.decode().strip().splitlines()[-1])
    assert got["envd_url"] == f"https://49983-{SID}.{domain}"
    assert got["echo"] == "streamed over https\n"
    assert got["read"] == "written over https"
    assert got["guest"] == {"path": "/hello"}
