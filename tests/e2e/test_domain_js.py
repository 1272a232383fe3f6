"""The JavaScript SDK 2.x (npm `e2b` 2.51, unchanged) by name over HTTPS, and WebSockets over
TLS by name for it and the Python SDK 2.63: each configured only with `E2B_DOMAIN`,
`E2B_API_KEY` and the CA bundle (`NODE_EXTRA_CA_CERTS`, `SSL_CERT_FILE`), as E2B's own
users configure them. `getHost(port)` names a server in the guest: `https://` reaches an
HTTP one, `wss://` a WebSocket echo one (tests/e2e/test_websocket.py's stdlib server) —
the proxy upgrades the connection after TLS, as E2B's does. The JS script
(tests/e2e/js/domain2.js) also signs file URLs, pauses and resumes with the servers
answering after, and wakes a paused sandbox with a plain HTTPS request (auto-resume). The
npm SDK comes from scripts/setup.sh (`.npm-e2b-ci`); missing, its test is skipped."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.e2e.by_name import by_name_env, last_json, run_by_name
from tests.e2e.conftest import Stack
from tests.e2e.test_websocket import ECHO_SERVER, PORT

pytestmark = pytest.mark.vm

ROOT = Path(__file__).resolve().parents[2]
NPM = ROOT / ".npm-e2b-ci" / "node_modules"
JS_SCRIPT = Path(__file__).with_name("js") / "domain2.js"

#: The Python SDK's side: the echo server started in the guest, reached at
#: `wss://{get_host(port)}` with the stack's CA (ssl's default context reads SSL_CERT_FILE).
WSS = """
import json, socket, ssl, sys
from e2b import Sandbox
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, BytesMessage, CloseConnection, Request, TextMessage

def events(sock, ws):
    while True:
        for ev in ws.events():
            yield ev
        data = sock.recv(65536)
        if not data:
            return
        ws.receive_data(data)

sbx = Sandbox.create(timeout=300)
out = {"id": sbx.sandbox_id, "host": sbx.get_host(PORT)}
try:
    sbx.files.write("/tmp/ws.py", sys.argv[1])
    sbx.commands.run("python3 /tmp/ws.py", background=True)
    sbx.commands.run(
        "for i in $(seq 100); do ss -ltn | grep -q :PORT && break; sleep 0.1; done"
    )
    host, port = out["host"].rsplit(":", 1) if ":" in out["host"] else (out["host"], 443)
    raw = socket.create_connection((host, int(port)), timeout=30)
    sock = ssl.create_default_context().wrap_socket(raw, server_hostname=host)
    ws = WSConnection(ConnectionType.CLIENT)
    sock.sendall(ws.send(Request(host=out["host"], target="/chat", subprotocols=["chat.v1"])))
    got = events(sock, ws)
    ev = next(got)
    out["accepted"] = [type(ev).__name__, getattr(ev, "subprotocol", None)]
    sock.sendall(ws.send(TextMessage(data="hello over wss")))
    out["text"] = next(got).data
    big = bytes(range(256)) * 160  # 40 KiB: several reads on both hops
    sock.sendall(ws.send(BytesMessage(data=big)))
    data = b""
    while len(data) < len(big) + 5:
        ev = next(got)
        assert isinstance(ev, BytesMessage), ev
        data += ev.data
    out["bytes"] = data == b"echo:" + big
    sock.sendall(ws.send(CloseConnection(code=1000)))
    ev = next(got)
    out["closed"] = [type(ev).__name__, getattr(ev, "code", None)]
finally:
    sbx.kill()
print(json.dumps(out))
""".replace("PORT", str(PORT))


def test_python_sdk_reaches_a_guest_websocket_over_tls_by_name(stack: Stack) -> None:
    got = run_by_name(stack, WSS.replace("sys.argv[1]", repr(ECHO_SERVER)))
    assert got["host"] == f"{PORT}-{got['id']}.{stack.tls_env['E2B_DOMAIN']}"
    assert got["accepted"] == ["AcceptConnection", "chat.v1"]
    assert got["text"] == "echo:hello over wss"
    assert got["bytes"] is True
    assert got["closed"] == ["CloseConnection", 1000]


def _run_js(stack: Stack) -> dict[str, object]:
    """domain2.js with only what a JS user sets: the domain, the API key and the CA."""
    env = by_name_env(stack) | {"NODE_PATH": str(NPM)}
    with tempfile.NamedTemporaryFile("w", suffix=".py") as server:
        server.write(ECHO_SERVER)
        server.flush()
        return last_json(["node", str(JS_SCRIPT), server.name], env, cwd=NPM.parent, timeout=400)


def _assert_echoed(wss: object) -> None:
    assert wss == {
        "protocol": "chat.v1",
        "replies": ["echo:hello over wss", [40 * 1024 + 5, "echo:"]],
        "bytesMatch": True,
        "closed": 1000,
    }


def test_javascript_sdk_2x_by_domain(stack: Stack) -> None:
    if not (NPM / "e2b").exists():
        pytest.skip(f"{NPM} missing: scripts/setup.sh installs npm e2b 2.x there")
    version = json.loads((NPM / "e2b" / "package.json").read_text())["version"]
    assert version.startswith("2."), version
    domain = stack.tls_env["E2B_DOMAIN"]
    got = _run_js(stack)
    sid = got["id"]
    assert got["host"] == f"8000-{sid}.{domain}"
    assert got["wsHost"] == f"{PORT}-{sid}.{domain}"
    assert got["echo"] == "hello from js 2.x\n"
    assert got["read"] == "written by js 2.x"
    assert got["served"] == [200, "served to js 2.x\n"]
    _assert_echoed(got["wss"])

    url = urlsplit(str(got["signedUrl"]))
    assert (url.scheme, url.netloc, url.path) == ("https", f"49983-{sid}.{domain}", "/files")
    query = parse_qs(url.query)
    assert query["path"] == ["js2.txt"] and query["username"] == ["root"]
    assert query["signature"][0].startswith("v1_") and "signature_expiration" in query
    down = got["down"]
    assert isinstance(down, dict) and len(down) == 6
    for key, (status, body) in down.items():
        assert status == 200, (key, body)
        assert body == ("root's" if key.startswith("root") else "written by js 2.x"), key
    up = got["up"]
    assert isinstance(up, dict) and len(up) == 6
    for name, (status, body) in up.items():
        home = "/root" if name.startswith("up-root") else "/home/user"
        assert status == 200, (name, body)
        assert body == [{"path": f"{home}/{name}", "name": name, "type": "file"}]
    owners = got["owners"]
    assert isinstance(owners, list)
    assert sorted(line for line in owners if line) == [
        "/home/user/up-undefined-120.txt user",
        "/home/user/up-undefined-undefined.txt user",
        "/home/user/up-user-120.txt user",
        "/home/user/up-user-undefined.txt user",
        "/root/up-root-120.txt root",
        "/root/up-root-undefined.txt root",
    ]
    assert got["expired"] == [401, {"code": 401, "message": "signature is already expired"}]
    assert got["unsigned"] == 401

    assert got["paused"] is True
    assert got["pausedState"] == "paused"
    assert got["resumedRunning"] is True
    assert got["afterResume"] == [200, "served to js 2.x\n"]
    _assert_echoed(got["wssAfterResume"])

    assert got["pausedAgain"] == "paused"
    assert got["woken"] == [200, "served to js 2.x\n"]
    assert got["wokenState"] == "running"
    assert got["envdAfterWake"] == "still here\n"
    assert got["killedAgain"] is False
    assert got["listedAfter"] is False
