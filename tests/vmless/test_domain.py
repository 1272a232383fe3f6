"""The sandbox domain over HTTPS, through the real stack (`aenv up`'s local CA and
listener, the API role's proxy): what a client that sets only `E2B_DOMAIN`, `E2B_API_KEY`
and `SSL_CERT_FILE` gets. The VM-less node gives its guests no address, so traffic to a
guest port is the e2e tier's (`tests/e2e/test_domain.py`); here: the control plane by
name, the answers' `domain`, and every refusal a name under the domain can meet."""

from __future__ import annotations

import json
import os
import socket
import ssl
import stat
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from aenv.stack.process import free_port
from aenv.tls import local_certificate
from tests.vmless.conftest import AENV, VmlessStack

#: The unchanged SDK in a process of its own, configured by the environment alone.
SCRIPT = """
import json, os
from e2b import Sandbox
sbx = Sandbox.create(timeout=120)
out = {
    "id": sbx.sandbox_id,
    "domain": sbx.sandbox_domain,
    "host": sbx.get_host(8000),
    "api_url": sbx.connection_config.api_url,
    "envd_url": sbx.envd_api_url,
    "listed": [s.sandbox_id for s in Sandbox.list().next_items()],
    "connected": Sandbox.connect(sbx.sandbox_id).sandbox_domain,
}
sbx.kill()
print(json.dumps(out))
"""


def _tls_only(vmless: VmlessStack) -> dict[str, str]:
    """The process environment of a client told only the domain, key and CA bundle."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("E2B_", "AENV_"))}
    env.pop("SSL_CERT_DIR", None)
    return {**env, **vmless.tls_env, "E2B_API_KEY": vmless.api_key}


def _client(vmless: VmlessStack) -> httpx.Client:
    return httpx.Client(verify=ssl.create_default_context(cafile=vmless.tls_env["SSL_CERT_FILE"]))


def test_aenv_up_prints_the_domain_and_its_ca(vmless: VmlessStack) -> None:
    tls = vmless.tls_env
    port = vmless.env["AENV_TLS_PORT"]
    assert tls["E2B_DOMAIN"] == f"aenv.localhost:{port}"
    tls_dir = vmless.data_dir / "tls"
    assert Path(tls["NODE_EXTRA_CA_CERTS"]) == tls_dir / "ca.pem"
    assert Path(tls["SSL_CERT_FILE"]) == tls_dir / "ca-bundle.pem"
    for key in ("ca.key", "tls.key"):
        assert stat.S_IMODE((tls_dir / key).stat().st_mode) == 0o600, key
    info = json.loads((vmless.data_dir / "stack.json").read_text())
    assert {k: info[k] for k in tls} == tls  # what `aenv up` prints again while it runs


def test_the_sdk_with_only_a_domain_works_over_https(vmless: VmlessStack) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=_tls_only(vmless),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    domain = vmless.tls_env["E2B_DOMAIN"]
    sid = got["id"]
    assert got["api_url"] == f"https://api.{domain}"
    assert got["domain"] == got["connected"] == domain  # the answers' `domain`
    assert got["host"] == f"8000-{sid}.{domain}"
    assert got["envd_url"] == f"https://49983-{sid}.{domain}"
    assert sid in got["listed"]
    assert time.monotonic() - started < 60


def test_names_under_the_domain_that_reach_nothing(vmless: VmlessStack) -> None:
    """E2B's 502 for a sandbox that is not there (at once, never a hang), a 400 for a name
    that names no sandbox port, and the API at `api.` and at the plain port alike."""
    domain = vmless.tls_env["E2B_DOMAIN"]
    with _client(vmless) as c:
        r = c.get(f"https://api.{domain}/health")
        assert r.status_code == 200, r.text
        r = c.get(f"https://api.{domain}/v2/sandboxes", headers={"X-API-KEY": vmless.api_key})
        assert r.status_code == 200 and isinstance(r.json(), list)
        r = c.get(f"https://api.{domain}/v2/sandboxes")
        assert r.status_code == 401 and set(r.json()) >= {"code", "message"}
        t0 = time.monotonic()
        r = c.get(f"https://8000-nosuchsandbox0000000.{domain}/")
        assert time.monotonic() - t0 < 5
        assert r.status_code == 502
        assert r.json() == {
            "sandboxId": "nosuchsandbox0000000",
            "code": 502,
            "message": "The sandbox was not found",
        }
        r = c.get(f"https://www.{domain}/")
        assert r.status_code == 400 and set(r.json()) == {"code", "message"}
        assert f"{{port}}-{{sandboxId}}.{domain}" in r.json()["message"]
    # the plain port routes the same names (a client that resolves them there)
    r = httpx.get(f"{vmless.api_url}/", headers={"Host": f"49983-nosuchsandbox0000000.{domain}"})
    assert r.status_code == 502 and r.json()["sandboxId"] == "nosuchsandbox0000000"


def test_a_sandbox_whose_guest_has_no_address_is_not_found(vmless: VmlessStack) -> None:
    """Running, yet never routed (the VM-less node's guests): the proxy waits its grace
    for the route, then answers E2B's 502 — bounded, not a hang."""
    with httpx.Client(
        base_url=vmless.api_url, headers={"X-API-KEY": vmless.api_key}, timeout=30
    ) as api:
        r = api.post("/v2/sandboxes", json={"templateID": "base", "timeout": 60})
        assert r.status_code == 201, r.text
        created = r.json()
        sid = created["sandboxID"]
        try:
            assert created["domain"] == vmless.tls_env["E2B_DOMAIN"]
            with _client(vmless) as c:
                t0 = time.monotonic()
                r = c.get(f"https://49983-{sid}.{vmless.tls_env['E2B_DOMAIN']}/health")
                assert r.status_code == 502 and r.json()["sandboxId"] == sid
                assert time.monotonic() - t0 < 10
        finally:
            api.delete(f"/sandboxes/{sid}")


def test_plain_http_to_the_tls_port_is_refused(vmless: VmlessStack) -> None:
    """Never served in the clear: the handshake fails and the connection ends unanswered."""
    host = urlsplit(vmless.api_url).hostname
    assert host is not None
    port = int(vmless.env["AENV_TLS_PORT"])
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(
            f"GET /health HTTP/1.1\r\nHost: api.{vmless.tls_env['E2B_DOMAIN']}\r\n\r\n".encode()
        )
        answer = b""
        while chunk := s.recv(4096):
            answer += chunk
    assert b"HTTP/1.1 200" not in answer and b"status" not in answer
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://{host}:{port}/health", timeout=10)


def _up_with(tmp_path: Path, tls: dict[str, str]) -> str:
    """`aenv up` with these TLS settings, which must fail at once and leave nothing
    running; its stderr."""
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("E2B_", "AENV_"))}
    env |= {"AENV_SANDBOX_DOMAIN": "aenv.localhost", **tls}
    args = ["--port", str(free_port()), "--tls-port", str(free_port())]
    up = subprocess.run(
        [*AENV, "up", "--data-dir", str(data), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert up.returncode != 0
    assert not (data / "stack.json").exists()
    left = subprocess.run(["pgrep", "-af", str(data)], capture_output=True, text=True)
    assert left.stdout.strip() == ""
    return up.stderr


def test_aenv_up_refuses_a_certificate_for_another_domain(tmp_path: Path) -> None:
    """The operator's certificate is checked before any service starts: `aenv up` fails
    at once, naming the file and the names the domain needs, and leaves nothing running."""
    cert = local_certificate(tmp_path / "ca", "other.localhost").certificate
    tls = {"AENV_TLS_CERT_FILE": str(cert.cert_file), "AENV_TLS_KEY_FILE": str(cert.key_file)}
    err = _up_with(tmp_path, tls)
    assert f"TLS certificate {cert.cert_file} is for *.other.localhost" in err, err
    assert "needs *.aenv.localhost" in err


def test_aenv_up_refuses_a_key_that_is_not_the_certificates(tmp_path: Path) -> None:
    cert = local_certificate(tmp_path / "a", "aenv.localhost").certificate
    other = local_certificate(tmp_path / "b", "aenv.localhost").certificate
    tls = {"AENV_TLS_CERT_FILE": str(cert.cert_file), "AENV_TLS_KEY_FILE": str(other.key_file)}
    err = _up_with(tmp_path, tls)
    assert "does not belong to the certificate" in err, err


def test_aenv_up_refuses_a_missing_key_or_half_a_pair(tmp_path: Path) -> None:
    cert = local_certificate(tmp_path / "ca", "aenv.localhost").certificate
    missing = tmp_path / "missing.pem"
    tls = {"AENV_TLS_CERT_FILE": str(cert.cert_file), "AENV_TLS_KEY_FILE": str(missing)}
    err = _up_with(tmp_path, tls)
    assert f"key {missing}: no such file" in err, err
    err = _up_with(tmp_path, {"AENV_TLS_CERT_FILE": str(cert.cert_file)})
    assert "AENV_TLS_CERT_FILE and AENV_TLS_KEY_FILE go together: set both" in err, err
