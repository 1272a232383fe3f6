"""Plain HTTP endpoints, auth, /init, and the Connect framing details clients depend on."""

from __future__ import annotations

import base64
import itertools
import json
import os
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2b import AuthenticationException, Sandbox

from envd.connect import EnvelopeParser, envelope
from envd.version import ENVD_VERSION
from tests.integration.envd.conftest import (
    Envd,
    make_sandbox,
    start_envd,
    stop_envd,
)

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def fresh_envd(test_user: str) -> Iterator[Envd]:
    """An envd of its own, not yet initialised (no token)."""
    e = start_envd("--default-user", test_user)
    yield e
    stop_envd(e)


def _stream(
    url: str, path: str, msg: dict[str, Any], headers: dict[str, str]
) -> Iterator[tuple[int, dict[str, Any]]]:
    """POST a server-streaming Connect call by hand; yield (flags, message) as they arrive."""
    hdrs = {"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1", **headers}
    body = envelope(json.dumps(msg).encode())
    with httpx.stream("POST", url + path, content=iter([body]), headers=hdrs, timeout=10) as r:
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/connect+json"
        parser = EnvelopeParser()
        for chunk in r.iter_raw():
            for flags, payload in parser.feed(chunk):
                yield flags, json.loads(payload)


def test_health_is_open(envd: Envd, sandbox: Sandbox) -> None:
    r = httpx.get(f"{envd.url}/health")
    assert r.status_code == 204
    assert sandbox.is_running() is True


def test_envs_and_metrics(envd: Envd) -> None:
    h = {"X-Access-Token": envd.token or ""}
    r = httpx.get(f"{envd.url}/envs", headers=h)
    assert r.status_code == 200 and r.json()["SANDBOX_VAR"] == "from-init"
    m = httpx.get(f"{envd.url}/metrics", headers=h).json()
    assert m["cpu_count"] >= 1 and m["mem_total"] > 0 and m["disk_total"] > 0
    # without the token: refused to anyone but the guest itself (127.0.0.1 — what E2B's
    # code interpreter dials for the sandbox's env vars); here, a peer at 127.0.0.2 stands
    # for the control plane and clients, which come through the slot's address
    with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2")) as outside:
        assert outside.get(f"{envd.url}/envs").status_code == 401
        assert outside.get(f"{envd.url}/metrics").status_code == 401
    inside = httpx.get(f"{envd.url}/envs")
    assert inside.status_code == 200 and inside.json()["SANDBOX_VAR"] == "from-init"
    assert httpx.get(f"{envd.url}/metrics").status_code == 401  # only the env vars


def test_wrong_token_is_refused(envd: Envd, workdir: str) -> None:
    bad = make_sandbox(envd, "wrong-token")
    with pytest.raises(AuthenticationException):
        bad.commands.run("true")
    with pytest.raises(AuthenticationException):
        bad.files.list(workdir)
    with pytest.raises(AuthenticationException):
        bad.files.read(f"{workdir}/x")
    with pytest.raises(AuthenticationException):
        bad.files.write(f"{workdir}/x", "x")
    assert bad.is_running() is True  # /health needs no token
    none = make_sandbox(envd, None)
    with pytest.raises(AuthenticationException):
        none.commands.list()


def test_errors_are_short_json_never_tracebacks(envd: Envd) -> None:
    h = {"X-Access-Token": envd.token or ""}
    r = httpx.get(f"{envd.url}/nope", headers=h)
    assert r.status_code == 404 and r.json()["code"] == 404
    r = httpx.post(
        f"{envd.url}/filesystem.Filesystem/Stat",
        content=b"{not json",
        headers={**h, "Content-Type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["code"] == "invalid_argument"
    r = httpx.post(
        f"{envd.url}/filesystem.Filesystem/Stat",
        content=b'{"path": 5}',
        headers={**h, "Content-Type": "application/json"},
    )
    assert r.status_code == 400 and "Traceback" not in r.text


def test_init_sets_token_env_defaults_and_is_idempotent(fresh_envd: Envd, workdir: str) -> None:
    open_sbx = make_sandbox(fresh_envd, None)
    assert open_sbx.commands.run("echo open").stdout == "open\n"
    now_ns = time.time_ns()
    body = {
        "accessToken": "t1",
        "envVars": {"A": "1"},
        "defaultUser": "root",
        "defaultWorkdir": workdir,
        "timestamp": now_ns,  # equal to now: the clock is left alone
        "entropy": base64.b64encode(os.urandom(64)).decode(),
        "hostname": socket.gethostname(),
    }
    r = httpx.post(f"{fresh_envd.url}/init", json=body)
    assert r.status_code == 204
    assert httpx.post(f"{fresh_envd.url}/init", json=body).status_code == 204  # idempotent
    with pytest.raises(AuthenticationException):
        open_sbx.commands.run("true")
    sbx = make_sandbox(fresh_envd, "t1")
    r2 = sbx.commands.run("echo $A; whoami; pwd")
    assert r2.stdout == f"1\nroot\n{workdir}\n"
    # a different token needs the current one
    r = httpx.post(f"{fresh_envd.url}/init", json={"accessToken": "t2"})
    assert r.status_code == 401
    r = httpx.post(
        f"{fresh_envd.url}/init", json={"accessToken": "t2"}, headers={"X-Access-Token": "t1"}
    )
    assert r.status_code == 204
    assert make_sandbox(fresh_envd, "t2").commands.run("echo ok").stdout == "ok\n"
    if os.geteuid() != 0:  # as root this would really set the host's clock: skipped
        r = httpx.post(
            f"{fresh_envd.url}/init",
            json={"timestamp": "2030-01-01T00:00:00.123456789Z"},
            headers={"X-Access-Token": "t2"},
        )
        assert r.status_code == 204  # not root: a logged no-op


def test_init_rejects_bad_bodies(fresh_envd: Envd) -> None:
    assert httpx.post(f"{fresh_envd.url}/init", content=b"[1]").status_code == 400
    assert httpx.post(f"{fresh_envd.url}/init", json={"timestamp": "yesterday"}).status_code == 400
    assert httpx.post(f"{fresh_envd.url}/init", content=b"").status_code == 204


def test_keepalive_events_at_requested_interval(envd: Envd) -> None:
    headers = {"X-Access-Token": envd.token or "", "Keepalive-Ping-Interval": "1"}
    msg = {"process": {"cmd": "/bin/bash", "args": ["-c", "sleep 1.6; echo done"]}, "stdin": False}
    kinds = []
    for flags, m in _stream(envd.url, "/process.Process/Start", msg, headers):
        if flags & 2:
            assert m == {}
            kinds.append("eos")
            break
        kinds.append(next(iter(m["event"])))
    assert kinds[0] == "start"
    assert "keepalive" in kinds
    assert kinds[-2:] == ["end", "eos"]


def test_stream_deadline_ends_with_deadline_exceeded(envd: Envd) -> None:
    h = {"X-Access-Token": envd.token or "", "Connect-Timeout-Ms": "300"}
    got = list(
        _stream(
            envd.url,
            "/process.Process/Start",
            {"process": {"cmd": "/bin/sleep", "args": ["10"]}},
            h,
        )
    )
    assert got[0][1]["event"]["start"]["pid"] > 0
    flags, last = got[-1]
    assert flags & 2
    assert last["error"]["code"] in ("deadline_exceeded",) or "end" in got[-2][1]["event"]


def test_expect_100_continue_and_chunked_upload(envd: Envd, workdir: str) -> None:
    with socket.create_connection(("127.0.0.1", envd.port)) as s:
        head = (
            f"POST /files?path={workdir}/c.txt HTTP/1.1\r\nHost: x\r\n"
            f"X-Access-Token: {envd.token}\r\nContent-Type: application/octet-stream\r\n"
            "Transfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n"
        )
        s.sendall(head.encode())
        assert s.recv(100).startswith(b"HTTP/1.1 100 Continue")
        s.sendall(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
        resp = s.recv(4096)
        assert resp.startswith(b"HTTP/1.1 200 OK")
    with open(f"{workdir}/c.txt", "rb") as f:
        assert f.read() == b"abcde"


def test_chunked_multipart_upload_with_boundary_lookalikes(envd: Envd, workdir: str) -> None:
    """Multipart parsed in place across HTTP chunk edges: the parser sees the body in pieces
    that end anywhere, including inside a boundary and inside look-alikes of one."""
    boundary = uuid.uuid4().hex
    delim = f"\r\n--{boundary}".encode()
    files = {
        f"{workdir}/mp/a.bin": os.urandom(300_000) + delim[:-1] + os.urandom(1000),
        f"{workdir}/mp/b.bin": delim[:-3] + os.urandom(2_000_000),
        f"{workdir}/mp/c/d.bin": os.urandom(1000) + delim[:5] + os.urandom(100_000),
    }
    body = (
        b"".join(
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{path}"\r\n'
            f"Content-Type: application/octet-stream\r\n\r\n".encode()
            + data
            + b"\r\n"
            for path, data in files.items()
        )
        + f"--{boundary}--\r\n".encode()
    )
    # A chunk edge inside every real boundary (1 byte in, halfway, all but 1 byte) and
    # every look-alike, with long chunks in between.
    edges = {0, len(body), *range(0, len(body), 700_001)}
    depths = [1, len(delim) // 2, len(delim) - 1]
    at = body.find(delim)
    while at >= 0:
        edges.add(at + depths[0])
        depths.append(depths.pop(0))
        at = body.find(delim, at + 1)
    at = body.find(delim[:5])
    while at >= 0:
        if not body.startswith(delim, at):
            edges.add(at + 3)
        at = body.find(delim[:5], at + 1)
    cuts = sorted(edges)
    chunks = [b"%x\r\n%b\r\n" % (b - a, body[a:b]) for a, b in itertools.pairwise(cuts)]
    with socket.create_connection(("127.0.0.1", envd.port)) as s:
        s.sendall(
            f"POST /files HTTP/1.1\r\nHost: x\r\nX-Access-Token: {envd.token}\r\n"
            f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
            "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n".encode()
        )
        for chunk in chunks:
            s.sendall(chunk)
        s.sendall(b"0\r\n\r\n")
        resp = b""
        while piece := s.recv(65536):
            resp += piece
    assert resp.startswith(b"HTTP/1.1 200 OK"), resp[:200]
    written = json.loads(resp.partition(b"\r\n\r\n")[2])
    assert [w["path"] for w in written] == list(files)
    for path, data in files.items():
        with open(path, "rb") as f:
            assert f.read() == data


def _capture() -> list[dict[str, Any]]:
    path = "/work/shared/e2b-wire-capture.jsonl"
    if not os.path.exists(path):
        return []
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if r["headers"].get("e2b-sandbox-port") == "49983"]


@pytest.fixture(scope="module")
def _golden_cleanup(home: str) -> Iterator[None]:
    yield
    import shutil

    for name in ("hello.txt", "d", "newdir", "stream.bin", "w.txt"):
        p = os.path.join(home, name)
        if os.path.isdir(p):
            shutil.rmtree(p, ignore_errors=True)
        elif os.path.isfile(p):
            os.unlink(p)


@pytest.mark.usefixtures("_golden_cleanup")
@pytest.mark.parametrize("row", _capture(), ids=lambda r: f"{r['method']} {r['path']}")
def test_golden_requests_from_sdk_capture(envd: Envd, row: dict[str, Any]) -> None:
    """Replay what e2b 2.63.0 sent (token swapped in) and check the framing of the answer."""
    headers: dict[str, str | None] = dict(row["headers"])
    headers.pop("host", None)
    headers.pop("content-length", None)
    headers.pop("transfer-encoding", None)
    if "x-access-token" in headers:
        headers["x-access-token"] = envd.token
    headers["connect-timeout-ms"] = "3000" if "connect-timeout-ms" in headers else None
    sent = {k: v for k, v in headers.items() if v is not None}
    url = envd.url + str(row["path"])
    route = str(row["path"]).split("?")[0]
    method = str(row["method"])
    if "envelopes" in row:
        body = b"".join(envelope(str(e["msg"]).encode(), int(e["flags"])) for e in row["envelopes"])
        with httpx.stream(method, url, content=iter([body]), headers=sent, timeout=10) as r:
            assert r.status_code == 200
            assert r.headers["content-type"] == "application/connect+json"
            parser = EnvelopeParser()
            messages = []
            for chunk in r.iter_raw():
                messages += parser.feed(chunk)
                if messages:
                    break
            flags, payload = messages[0]
            first = json.loads(payload)
            if flags & 2:
                assert set(first) <= {"error", "metadata"}
                assert first.get("error", {}).get("code") in (None, "not_found")
            elif "StreamInput" not in url:
                assert "start" in first.get("event", first)
        return
    content = (
        base64.b64decode(row["body_b64"])
        if "body_b64" in row
        else str(row.get("body", "")).encode()
    )
    r = httpx.request(method, url, content=content, headers=sent, timeout=10)
    if route == "/health":
        assert r.status_code == 204
    elif route == "/files":
        assert r.status_code in (200, 404), r.text
        if method == "POST":
            assert isinstance(r.json(), list) and r.json()[0]["path"]
    else:
        assert r.headers["content-type"].startswith("application/json")
        if r.status_code != 200:
            assert r.json()["code"] in ("not_found", "already_exists"), r.text


def test_version_is_pep440_and_gates_open() -> None:
    from packaging.version import Version

    assert Version(ENVD_VERSION) >= Version("0.5.7")


def test_unique_ids() -> None:
    assert uuid.uuid4() != uuid.uuid4()


def test_envd_is_single_threaded(envd: Envd) -> None:
    """PTY children are forked with a preexec hook: only safe while envd has one thread."""
    assert os.listdir(f"/proc/{envd.proc.pid}/task") == [str(envd.proc.pid)]
