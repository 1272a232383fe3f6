"""The e2b 1.x SDKs, unchanged, against a real VM: Python 1.3.3 (still pinned by RL stacks,
e.g. SkyRL's OpenHands agent) and 1.11.1, and JavaScript 1.13.2 — the last 1.x of each.
They know no `E2B_API_URL` nor `E2B_SANDBOX_URL`: configured only with `E2B_DOMAIN`,
`E2B_API_KEY` and the CA bundle, they reach the API at `https://api.{domain}` and envd and
`get_host(port)` at `https://{port}-{id}.{domain}`, as `tests/e2e/test_domain.py` does for
2.x. 1.3.3 also names a sandbox `{sandboxID}-{clientID}` everywhere (host names and API
paths), which E2B's API and proxy cut back to the sandbox id. Each creates a sandbox, runs a
command, writes and reads a file, fetches a guest's HTTP server at `get_host(8000)`, talks
to a guest's WebSocket echo server at `wss://{get_host(8765)}`, downloads and uploads through
`download_url`/`upload_url` (signed where the SDK makes secured sandboxes) and kills it. The
1.x SDKs have no pause, resume or lifecycle: those are 2.x's (test_domain_files.py,
test_domain_js.py, E2B's suites). Each side environment comes from scripts/setup.sh; a
missing one skips its case."""

from __future__ import annotations

import tempfile
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.e2e.by_name import by_name_env, last_json
from tests.e2e.conftest import Stack
from tests.e2e.test_websocket import ECHO_SERVER
from tests.e2e.test_websocket import PORT as WS_PORT

pytestmark = pytest.mark.vm

ROOT = Path(__file__).resolve().parents[2]
JS = ROOT / ".npm-e2b-1"
JS_SCRIPT = Path(__file__).with_name("js") / "sdk1x.js"

SCRIPT = """
import base64, hashlib, importlib.metadata as m, json, os, socket, ssl, sys, time
import httpx
from e2b import Sandbox

def ws_echo(host):
    # one text message to the guest's echo server over wss:// by name, with the stdlib
    # (the 1.x environments have no WebSocket client); ssl trusts SSL_CERT_FILE's CA
    name, port = host.rsplit(":", 1) if ":" in host else (host, "443")
    sock = ssl.create_default_context().wrap_socket(
        socket.create_connection((name, int(port)), timeout=30), server_hostname=name
    )
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((
        f"GET /chat HTTP/1.1\\r\\nHost: {host}\\r\\nUpgrade: websocket\\r\\n"
        f"Connection: Upgrade\\r\\nSec-WebSocket-Key: {key}\\r\\n"
        "Sec-WebSocket-Version: 13\\r\\n\\r\\n"
    ).encode())
    got = b""
    while b"\\r\\n\\r\\n" not in got:
        got += sock.recv(4096)
    head, frame = got.split(b"\\r\\n\\r\\n", 1)
    accept = base64.b64encode(
        hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()
    )
    msg, mask = b"hello over wss", os.urandom(4)
    sock.sendall(bytes([0x81, 0x80 | len(msg)]) + mask
                 + bytes(b ^ mask[i % 4] for i, b in enumerate(msg)))
    while len(frame) < 2 or len(frame) < 2 + (frame[1] & 127):
        frame += sock.recv(4096)
    sock.close()
    return [head.split(b"\\r\\n")[0].decode(), accept in head,
            frame[2:2 + (frame[1] & 127)].decode()]

assert m.version("e2b") == sys.argv[1], m.version("e2b")
secure = {"secure": True} if sys.argv[2] == "secure" else {}
sbx = Sandbox(timeout=300, **secure)
out = {"id": sbx.sandbox_id, "host": sbx.get_host(8000), "envd_url": sbx.envd_api_url}
try:
    out["echo"] = sbx.commands.run("echo hello from 1.x").stdout
    sbx.files.write("/home/user/one.txt", "written by 1.x")
    out["read"] = sbx.files.read("/home/user/one.txt")
    sbx.commands.run(
        "mkdir -p /tmp/www && echo served to 1.x > /tmp/www/index.html && "
        "cd /tmp/www && python3 -m http.server 8000 >/dev/null 2>&1 &"
    )
    url = f"https://{sbx.get_host(8000)}/index.html"
    deadline = time.monotonic() + 30
    while True:  # until the guest's server listens (it starts in the background)
        r = httpx.get(url, timeout=10)  # SSL_CERT_FILE: httpx trusts the stack's CA
        if r.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    out["served"] = [r.status_code, r.text]
    out["listed"] = any(s.sandbox_id == sbx.sandbox_id for s in Sandbox.list())
    # file URLs by name: signed when the sandbox is secure (1.11's `secure=True`)
    out["down"] = sbx.download_url("/home/user/one.txt")
    r = httpx.get(out["down"], timeout=30)
    out["got"] = [r.status_code, r.text]
    up = sbx.upload_url("/home/user/up.txt")
    r = httpx.post(up, files={"file": ("up.txt", b"uploaded by 1.x")}, timeout=30)
    out["posted"] = r.status_code
    out["uploaded"] = sbx.files.read("/home/user/up.txt")
    sbx.files.write("/tmp/ws.py", sys.argv[3])
    sbx.commands.run("python3 /tmp/ws.py", background=True)
    sbx.commands.run(
        "for i in $(seq 100); do ss -ltn | grep -q :WS_PORT && break; sleep 0.1; done"
    )
    out["ws_host"] = sbx.get_host(WS_PORT)
    out["wss"] = ws_echo(out["ws_host"])
finally:
    sbx.kill()
out["killed_again"] = Sandbox.kill(sbx.sandbox_id)  # False: it is gone
out["listed_after"] = any(s.sandbox_id == sbx.sandbox_id for s in Sandbox.list())
print(json.dumps(out))
""".replace("WS_PORT", str(WS_PORT))


def _assert_seen(stack: Stack, got: dict[str, object], *, signed: bool) -> None:
    sid = str(got["id"])
    assert got["host"] == f"8000-{sid}.{stack.tls_env['E2B_DOMAIN']}"
    assert got["echo"] == "hello from 1.x\n"
    assert got["read"] == "written by 1.x"
    assert got["served"] == [200, "served to 1.x\n"]
    assert got["listed"] is True
    assert got["killed_again"] is False
    assert got["listed_after"] is False
    assert got["ws_host"] == f"{WS_PORT}-{sid}.{stack.tls_env['E2B_DOMAIN']}"
    assert got["wss"] == ["HTTP/1.1 101 Switching Protocols", True, "echo:hello over wss"]
    url = urlsplit(str(got["down"]))
    assert (url.scheme, url.path) == ("https", "/files")
    assert url.netloc == f"49983-{sid}.{stack.tls_env['E2B_DOMAIN']}"
    assert ("signature" in parse_qs(url.query)) is signed
    assert got["got"] == [200, "written by 1.x"]
    assert got["posted"] == 200
    assert got["uploaded"] == "uploaded by 1.x"


#: 1.3.3 knows no secured sandboxes (its file URLs carry no signature); 1.11 creates one
#: with `secure=True` and signs them
@pytest.mark.parametrize(("version", "secure"), [("1.3.3", False), ("1.11.1", True)])
def test_python_sdk_1x_by_domain(stack: Stack, version: str, secure: bool) -> None:
    python = ROOT / f".venv-e2b-{version}" / "bin" / "python"
    if not python.exists():
        pytest.skip(f"{python} missing: scripts/setup.sh installs e2b {version} there")
    argv = [str(python), "-c", SCRIPT, version, "secure" if secure else "plain", ECHO_SERVER]
    got = last_json(argv, by_name_env(stack), cwd=ROOT)
    assert got["envd_url"] == f"https://49983-{got['id']}.{stack.tls_env['E2B_DOMAIN']}"
    _assert_seen(stack, got, signed=secure)


def test_javascript_sdk_1x_by_domain(stack: Stack) -> None:
    if not (JS / "node_modules" / "e2b").exists():
        pytest.skip(f"{JS} missing: scripts/setup.sh installs npm e2b 1.13.2 there")
    env = by_name_env(stack) | {"NODE_PATH": str(JS / "node_modules")}
    # Node 20's WebSocket client is behind a flag (global from Node 22 on)
    with tempfile.NamedTemporaryFile("w", suffix=".py") as server:
        server.write(ECHO_SERVER)
        server.flush()
        argv = ["node", "--experimental-websocket", str(JS_SCRIPT), server.name]
        _assert_seen(stack, last_json(argv, env, cwd=JS), signed=True)
