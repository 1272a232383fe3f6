"""Bad input against the live API answers a 4xx with E2B's `{code, message}`, never a 500:
ids outside the id alphabet, NUL bytes, oversized fields and bodies, deeply nested JSON.
And none of it reaches the log, where a NUL would stop the read model that folds it."""

from __future__ import annotations

import socket
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.vmless.conftest import VmlessStack

BUILD = str(uuid.UUID(int=1))

#: (method, path, request kwargs, the status E2B's contract calls for)
CASES: dict[str, tuple[str, str, dict[str, Any], int]] = {
    "kill a.b": ("DELETE", "/sandboxes/a.b", {}, 404),
    "kill a*": ("DELETE", "/sandboxes/a*", {}, 404),
    "pause a>": ("POST", "/sandboxes/a%3E/pause", {}, 404),
    "timeout a.b": ("POST", "/sandboxes/a.b/timeout", {"json": {"timeout": 30}}, 404),
    "connect a b": ("POST", "/v2/sandboxes/a%20b/connect", {"json": {}}, 404),
    "snapshot a.b": ("POST", "/sandboxes/a.b/snapshots", {"json": {}}, 404),
    "delete template a b": ("DELETE", "/templates/a%20b", {}, 404),
    "delete template a*": ("DELETE", "/templates/a*", {}, 404),
    "build status a.b": ("GET", "/templates/t1/builds/a.b/status", {}, 400),
    "start build *": ("POST", "/v2/templates/t1/builds/*", {"json": {}}, 400),
    "NUL in a sandbox id": ("GET", "/sandboxes/a%00b", {}, 400),
    "NUL in a template id": ("DELETE", "/templates/a%00b", {}, 400),
    "NUL in an alias": ("GET", "/templates/aliases/a%00b", {}, 400),
    "NUL in the metadata filter": ("GET", "/v2/sandboxes", {"params": {"metadata": "a=\0"}}, 400),
    "NUL in the template filter": ("GET", "/v2/sandboxes", {"params": {"template": "\0"}}, 400),
    "NUL in snapshot filters": ("GET", "/snapshots", {"params": {"sandboxID": "\0"}}, 400),
    "NUL in a query key": ("GET", "/v2/sandboxes", {"params": {"\0": "x"}}, 400),
    "NUL in templateID": ("POST", "/v2/sandboxes", {"json": {"templateID": "ba\0se"}}, 400),
    # a template id the bus cannot carry: nothing of it can ever have been stored
    "templateID a*b": ("POST", "/v2/sandboxes", {"json": {"templateID": "a*b"}}, 400),
    "templateID a b": ("POST", "/v2/sandboxes", {"json": {"templateID": "a b"}}, 400),
    "templateID a>": ("POST", "/sandboxes", {"json": {"templateID": "a>"}}, 400),
    "no such template a.b": ("POST", "/v2/sandboxes", {"json": {"templateID": "a.b"}}, 404),
    "an image in the metadata that is none": (
        "POST",
        "/v2/sandboxes",
        {"json": {"templateID": "base", "metadata": {"aenv.image": "Not An/Image"}}},
        400,
    ),
    "NUL in metadata": (
        "POST",
        "/v2/sandboxes",
        {"json": {"templateID": "base", "metadata": {"a": "\0"}}},
        400,
    ),
    "NUL in an env var name": (
        "POST",
        "/v2/sandboxes",
        {"json": {"templateID": "base", "envVars": {"\0": "x"}}},
        400,
    ),
    "NUL in a build step": (
        "POST",
        f"/v2/templates/t1/builds/{BUILD}",
        {"json": {"steps": [{"type": "RUN", "args": ["echo \0"]}]}},
        400,
    ),
    "1 MiB metadata value": (
        "POST",
        "/v2/sandboxes",
        {"json": {"templateID": "base", "metadata": {"a": "x" * (1 << 20)}}},
        413,
    ),
    "300 KiB metadata": (
        "POST",
        "/v2/sandboxes",
        {"json": {"templateID": "base", "metadata": {f"k{i}": "x" * 1000 for i in range(300)}}},
        400,
    ),
    "5 MB of env vars": (
        "POST",
        "/v2/sandboxes",
        {"json": {"templateID": "base", "envVars": {f"K{i}": "x" * 1000 for i in range(5000)}}},
        413,
    ),
    "100,000-deep JSON": (
        "POST",
        "/v2/sandboxes",
        {
            "content": b"[" * 100_000 + b"]" * 100_000,
            "headers": {"content-type": "application/json"},
        },
        400,
    ),
    "50,000-deep metadata": (  # 100,000 would be over the body limit
        "POST",
        "/v2/sandboxes",
        {
            "content": b'{"templateID":"base","metadata":'
            + b'{"a":' * 50_000
            + b"1"
            + b"}" * 50_001,
            "headers": {"content-type": "application/json"},
        },
        400,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_a_4xx_in_e2bs_error_shape(vmless: VmlessStack, case: str) -> None:
    method, path, kwargs, status = CASES[case]
    with vmless.client() as c:
        r = c.request(method, path, **kwargs)
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"code", "message"} and body["code"] == status, body
    assert isinstance(body["message"], str) and body["message"]


def test_the_code_interpreter_s_template_when_not_served_says_how_to_serve_it(
    vmless: VmlessStack,
) -> None:
    """`e2b_code_interpreter`'s default template on a stack whose nodes do not build it: a
    404 that names the setting, not a bare "not found"."""
    with vmless.client() as c:
        r = c.post("/v2/sandboxes", json={"templateID": "code-interpreter-v1"})
    assert r.status_code == 404, r.text
    body = r.json()
    assert body["code"] == 404 and "AENV_CODE_INTERPRETER=1" in body["message"], body


def test_a_nul_in_a_header_is_refused_by_the_http_parser(vmless: VmlessStack) -> None:
    """It never reaches the app: uvicorn answers 400 itself (in its own plain-text body)."""
    url = urlsplit(vmless.api_url)
    request = (
        f"GET /v2/sandboxes HTTP/1.1\r\nHost: {url.netloc}\r\nX-API-KEY: {vmless.api_key}\r\n"
        "Idempotency-Key: a\0b\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection((url.hostname, url.port), timeout=10) as s:
        s.sendall(request)
        status_line = s.makefile("rb").readline()
    assert status_line.split()[1] == b"400", status_line


def test_valid_input_at_the_limits_is_taken_and_the_read_model_keeps_up(
    vmless: VmlessStack,
) -> None:
    """Metadata and env vars just under their limits create a sandbox; the refused NUL
    (above) never reached the log, so the listing still follows new sandboxes."""
    with vmless.client() as c:
        assert (
            c.post(
                "/v2/sandboxes", json={"templateID": "base", "metadata": {"a": "\0"}}
            ).status_code
            == 400
        )
        body = {
            "templateID": "base",
            "timeout": 60,
            "metadata": {"edge": "limits", "big": "m" * (60 << 10)},
            "envVars": {f"E{i}": "e" * (100 << 10) for i in range(2)},
        }
        r = c.post("/v2/sandboxes", json=body)
        assert r.status_code == 201, r.text
        sid = r.json()["sandboxID"]
        deadline = time.monotonic() + 20
        while True:
            listed = c.get("/v2/sandboxes", params={"metadata": "edge=limits"})
            assert listed.status_code == 200, listed.text
            if [s["sandboxID"] for s in listed.json()] == [sid]:
                break
            assert time.monotonic() < deadline, "the read model stopped following the log"
            time.sleep(0.2)
        assert listed.json()[0]["metadata"]["big"] == "m" * (60 << 10)
        assert c.delete(f"/sandboxes/{sid}").status_code == 204
