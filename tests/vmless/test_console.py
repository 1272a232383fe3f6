"""The web console's routes on the real stack (VM-less): pages are data-free shells, every
fragment takes the REST API's key and shows only the key's team, the sandbox list filters
and pages over the read model, a sandbox's timeline comes from its log and its fork tree
from the read model, a build's log streams until the build ends, and the terminal's
WebSocket refuses what the REST routes refuse. (The browser drives all of it in
`test_console_browser.py`; a live terminal needs a VM: `tests/e2e/test_console.py`.)"""

from __future__ import annotations

import json
import re
import secrets
import socket
from collections.abc import Iterator
from urllib.parse import urlparse

import httpx
import pytest
from e2b import BuildException, Sandbox, Template
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Request, TextMessage

from tests.vmless.conftest import VmlessStack

pytestmark = pytest.mark.usefixtures("sdk_env")


@pytest.fixture
def c(vmless: VmlessStack) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=vmless.api_url, headers={"X-API-KEY": vmless.api_key}, timeout=30
    ) as client:
        yield client


@pytest.fixture(scope="module")
def other_key(vmless: VmlessStack) -> str:
    """A key of another team."""
    out = vmless.aenv("keys", "create", "--team", "rival", "--data-dir", str(vmless.data_dir))
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def _ids(html: str) -> list[str]:
    return re.findall(r'<tr data-sid="([a-z0-9]+)">', html)


def test_pages_hold_no_data_and_fragments_need_a_valid_key(
    vmless: VmlessStack, c: httpx.Client
) -> None:
    sbx = Sandbox.create(timeout=120)
    try:
        for path in (
            "/console",
            "/console/sandboxes",
            f"/console/sandboxes/{sbx.sandbox_id}",
            f"/console/sandboxes/{sbx.sandbox_id}/terminal",
            "/console/templates",
        ):
            page = httpx.get(vmless.api_url + path)  # no key
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
            assert "/console/static/console.js" in page.text
            # the key lives in session storage: no inline or foreign script may run here
            assert "script-src 'self';" in page.headers["content-security-policy"]
            assert "<script>" not in page.text and " on" not in re.sub(r">[^<]*<", "><", page.text)
            # a shell: no state, no row of any sandbox (the fragments bring those)
            assert 'data-status="' not in page.text and "<tr data-sid" not in page.text
        for path in (
            "/console/f/fleet",
            "/console/f/sandboxes",
            "/console/f/whoami",
            f"/console/f/sandboxes/{sbx.sandbox_id}/history",
        ):
            for headers in ({}, {"X-API-KEY": "e2b_" + "0" * 40}):
                r = httpx.get(vmless.api_url + path, headers=headers)
                assert r.status_code == 401, (path, r.text)
                assert set(r.json()) == {"code", "message"}
        assert c.get("/console/f/whoami").json()["team"] == "default"
        assert c.get("/console/static/vendor/htmx.min.js").status_code == 200
        paths = c.get("/openapi/openapi.json").json()["paths"]
        assert not [p for p in paths if p.startswith("/console")]  # not E2B's API
    finally:
        sbx.kill()


def test_the_fleet_shows_the_node_room_and_the_teams_sandboxes_by_state(c: httpx.Client) -> None:
    sbx = Sandbox.create(timeout=120)
    try:
        html = c.get("/console/f/fleet").text
        node = re.search(r'<tr data-node="vmless">(.*?)</tr>', html, re.S)
        assert node is not None and "beating" in node.group(1)
        assert re.search(r"\d+ / \d+ MiB", node.group(1))  # its memory room
        running = re.search(r'status=running">.*?<b>(\d+)</b>', html, re.S)
        assert running is not None and int(running.group(1)) >= 1
    finally:
        sbx.kill()


def test_the_list_filters_by_state_template_metadata_and_node_and_pages(c: httpx.Client) -> None:
    run = secrets.token_hex(4)
    made = []
    for i in range(53):  # paused as made: a paused sandbox takes no room on the node
        made.append(Sandbox.create(timeout=120, metadata={"run": run, "i": str(i)}))
        made[-1].pause()
    try:
        Sandbox.connect(made[0].sandbox_id, timeout=120)
        made[1].kill()
        f = {"metadata": f"run={run}"}
        first = c.get("/console/f/sandboxes", params=f).text
        assert "52 sandboxes · 1\u201350 shown" in first  # killed ones are hidden by default
        assert _ids(first)[0] == made[-1].sandbox_id  # newest first
        second = c.get("/console/f/sandboxes", params={**f, "page": 2}).text
        assert _ids(second) == [made[2].sandbox_id, made[0].sandbox_id]
        assert "page 2 of 2" in second
        every = c.get("/console/f/sandboxes", params={**f, "status": "all"}).text
        assert "53 sandboxes" in every
        running = c.get("/console/f/sandboxes", params={**f, "status": "running"}).text
        assert _ids(running) == [made[0].sandbox_id]
        paused = c.get("/console/f/sandboxes", params={**f, "status": "paused"}).text
        assert "51 sandboxes" in paused
        killed = c.get("/console/f/sandboxes", params={**f, "status": "killed"}).text
        assert _ids(killed) == [made[1].sandbox_id]
        one = c.get("/console/f/sandboxes", params={"metadata": f"run={run}&i=7"}).text
        assert _ids(one) == [made[7].sandbox_id]
        assert (
            "52 sandboxes"
            in c.get(
                "/console/f/sandboxes", params={**f, "node": "vmless", "template": "base"}
            ).text
        )
        assert "0 sandboxes" in c.get("/console/f/sandboxes", params={**f, "node": "nowhere"}).text
        assert c.get("/console/f/sandboxes", params={"page": 0}).status_code == 400
    finally:
        for s in made[2:]:
            s.kill()
        made[0].kill()


def test_a_sandbox_page_shows_its_life_from_the_log_and_its_fork_tree(c: httpx.Client) -> None:
    sbx = Sandbox.create(timeout=120, metadata={"who": "<b>me</b>"})
    sid = sbx.sandbox_id
    kids: list[str] = []
    try:
        sbx.pause()
        Sandbox.connect(sid, timeout=120)
        r = c.post(f"/sandboxes/{sid}/fork", json={"count": 2})
        assert r.status_code == 201, r.text
        kids = [k["sandbox"]["sandboxID"] for k in r.json()]
        head = c.get(f"/console/f/sandboxes/{sid}").text
        assert 'data-status="running"' in head and "&lt;b&gt;me&lt;/b&gt;" in head
        assert re.search(r'class="ttl" data-end-at="[^"]+"', head)
        past = c.get(f"/console/f/sandboxes/{sid}/history").text
        events = re.findall(r'<tr class="\w+" data-type="(\w+)">', past)
        assert events == [
            "SandboxRequested",
            "SandboxCreated",
            "SandboxPauseRequested",
            "SandboxPaused",
            "SandboxResumeRequested",
            "SandboxResumed",
            "SandboxForkRequested",
            "SandboxForked",
        ]
        took = re.findall(r'<td class="num">([^<]*)</td>\s*<td class="mono small nw">', past)
        assert [bool(t.strip()) for t in took] == [False, True] * 4  # each outcome timed
        assert "key " in past  # the actor: the API key that asked
        tree = re.findall(r'class="node [^"]*" data-sid="(\w+)" data-status="(\w+)"', past)
        assert dict(tree) == {sid: "running", kids[0]: "running", kids[1]: "running"}
        child = c.get(f"/console/f/sandboxes/{kids[0]}/history").text  # the same family
        assert set(re.findall(r'data-sid="(\w+)" data-status', child)) == {sid, *kids}
        Sandbox.kill(kids[1])
        gone = c.get(f"/console/f/sandboxes/{kids[1]}").text  # killed: still on the console
        assert 'data-status="killed"' in gone
        assert 'data-type="SandboxKilled"' in c.get(f"/console/f/sandboxes/{kids[1]}/history").text
        assert c.get("/console/f/sandboxes/nosuchsandbox").status_code == 404
        assert c.get("/console/f/sandboxes/NOT-AN-ID").status_code == 404
    finally:
        for s in [sid, *kids]:
            Sandbox.kill(s)


def _ws_close(api_url: str, path: str, hello: dict[str, object]) -> tuple[int, str]:
    """Opens the console's WebSocket, sends `hello`, returns how the server closed it."""
    u = urlparse(api_url)
    sock = socket.create_connection((u.hostname, u.port), timeout=15)
    ws = WSConnection(ConnectionType.CLIENT)
    sock.sendall(ws.send(Request(host=f"{u.hostname}:{u.port}", target=path)))
    try:
        while True:
            data = sock.recv(65536)
            assert data, "the server hung up without a close frame"
            ws.receive_data(data)
            for event in ws.events():
                if isinstance(event, AcceptConnection):
                    sock.sendall(ws.send(TextMessage(data=json.dumps(hello))))
                elif isinstance(event, CloseConnection):
                    return event.code, event.reason
    finally:
        sock.close()


def test_another_teams_key_sees_nothing_and_changes_nothing(
    vmless: VmlessStack, c: httpx.Client, other_key: str
) -> None:
    sbx = Sandbox.create(timeout=120, metadata={"team": "default"})
    sid = sbx.sandbox_id
    try:
        with httpx.Client(base_url=vmless.api_url, headers={"X-API-KEY": other_key}) as rival:
            assert rival.get("/console/f/whoami").json()["team"] == "rival"
            for path in (f"/console/f/sandboxes/{sid}", f"/console/f/sandboxes/{sid}/history"):
                r = rival.get(path)
                assert r.status_code == 404 and r.json()["message"] == f'sandbox "{sid}" not found'
            assert sid not in rival.get("/console/f/sandboxes", params={"status": "all"}).text
            assert "0 sandboxes" in rival.get("/console/f/sandboxes").text
            # what the page's buttons send: the REST routes, which refuse the same way
            assert rival.post(f"/sandboxes/{sid}/pause", json={}).status_code == 404
            assert rival.delete(f"/sandboxes/{sid}").status_code == 404
        terminal = f"/console/ws/sandboxes/{sid}/terminal"
        assert _ws_close(vmless.api_url, terminal, {"key": other_key}) == (
            4404,
            f'sandbox "{sid}" not found',
        )
        code, _ = _ws_close(vmless.api_url, terminal, {"key": "e2b_" + "1" * 40})
        assert code == 4401
        sbx.pause()
        code, reason = _ws_close(vmless.api_url, terminal, {"key": vmless.api_key})
        assert code == 4409 and "paused" in reason
        assert c.get(f"/console/f/sandboxes/{sid}").status_code == 200  # still ours, paused
    finally:
        sbx.kill()


def test_a_builds_log_streams_until_the_build_ends(
    c: httpx.Client, other_key: str, vmless: VmlessStack
) -> None:
    name = f"console-{secrets.token_hex(3)}"
    # a step needs a VM's envd: here it fails, after the FROM step logged its lines
    with pytest.raises(BuildException):
        Template.build(Template().from_image("busybox:latest").run_cmd("echo hi"), name)
    listing = c.get("/console/f/templates").text
    build_id = re.search(rf'data-build="([0-9a-f-]+)" data-template="{name}"', listing)
    assert build_id is not None, listing
    bid = build_id.group(1)
    with c.stream("GET", f"/console/f/builds/{bid}/log") as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(ln) for ln in r.iter_lines() if ln]
    assert [ln["idx"] for ln in lines[:-1]] == list(range(len(lines) - 1))
    assert "RUN echo hi" in " ".join(ln["message"] for ln in lines[:-1])
    assert lines[-1]["status"] == "error" and lines[-1]["reason"]
    tail = [
        json.loads(ln)
        for ln in c.get(
            f"/console/f/builds/{bid}/log", params={"offset": len(lines) - 2}
        ).text.splitlines()
    ]
    assert [ln.get("idx") for ln in tail] == [len(lines) - 2, None]
    head = c.get(f"/console/f/builds/{bid}").text
    assert 'data-status="error"' in head
    with httpx.Client(base_url=vmless.api_url, headers={"X-API-KEY": other_key}) as rival:
        assert rival.get(f"/console/f/builds/{bid}").status_code == 404
        assert rival.get(f"/console/f/builds/{bid}/log").status_code == 404
