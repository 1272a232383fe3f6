"""A sandbox by name over HTTPS, with a real VM and the unchanged SDK configured as E2B's
own users configure it: `E2B_DOMAIN`, `E2B_API_KEY` and the CA bundle (`SSL_CERT_FILE`),
no `E2B_API_URL` nor `E2B_SANDBOX_URL`. The SDK then reaches the API at
`https://api.{domain}` and envd at `https://49983-{id}.{domain}`; `get_host(port)` names a
server in the guest, fetched over HTTPS with the stack's CA. Names resolve through this
machine's `*.localhost` (scripts/setup.sh); the stack's proxy goes through the node's
(`AENV_PROXY_VIA_NODE`), as a fleet's does."""

from __future__ import annotations

import pytest

from tests.e2e.by_name import run_by_name
from tests.e2e.conftest import Stack

pytestmark = pytest.mark.vm

SCRIPT = """
import json, time
import httpx
from e2b import Sandbox

sbx = Sandbox.create(timeout=300)
try:
    out = {"id": sbx.sandbox_id, "envd_url": sbx.envd_api_url, "host": sbx.get_host(8000)}
    out["echo"] = sbx.commands.run("echo hello by name").stdout
    sbx.files.write("/home/user/by-name.txt", "written over https")
    out["read"] = sbx.files.read("/home/user/by-name.txt")
    sbx.commands.run(
        "mkdir -p /tmp/www && echo served by the guest > /tmp/www/index.html && "
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
    out["missing"] = httpx.get(f"https://{sbx.get_host(8001)}/", timeout=10).status_code
finally:
    sbx.kill()
print(json.dumps(out))
"""


#: The SDK's signed file URLs (envd's `signature` query), which carry the sandbox in the
#: host name here: with `E2B_SANDBOX_URL` they carry none, and no proxy can route them.
SIGNED = """
import json
import httpx
from e2b import Sandbox

sbx = Sandbox.create(timeout=300)
try:
    sbx.files.write("/home/user/signed.txt", "fetched by a signed url")
    down = sbx.download_url("/home/user/signed.txt")
    up = sbx.upload_url("/home/user/uploaded.txt")
    out = {"down": down, "got": httpx.get(down, timeout=30).text}
    r = httpx.post(up, files={"file": ("uploaded.txt", b"sent by a signed url")}, timeout=30)
    out["posted"] = r.status_code
    out["uploaded"] = sbx.files.read("/home/user/uploaded.txt")
    out["unsigned"] = httpx.get(down.split("&signature=")[0], timeout=30).status_code
finally:
    sbx.kill()
print(json.dumps(out))
"""


def test_the_sdk_reaches_a_sandbox_and_its_ports_by_name(stack: Stack) -> None:
    domain = stack.tls_env["E2B_DOMAIN"]
    got = run_by_name(stack, SCRIPT)
    sid = got["id"]
    assert got["envd_url"] == f"https://49983-{sid}.{domain}"
    assert got["host"] == f"8000-{sid}.{domain}"
    assert got["echo"] == "hello by name\n"
    assert got["read"] == "written over https"
    assert got["served"] == [200, "served by the guest\n"]
    assert got["missing"] == 502  # a port nothing listens on: E2B's 502, not a hang


def test_signed_file_urls_reach_the_sandbox_by_name(stack: Stack) -> None:
    got = run_by_name(stack, SIGNED)
    assert str(got["down"]).startswith("https://49983-")
    assert got["got"] == "fetched by a signed url"
    assert got["posted"] == 200
    assert got["uploaded"] == "sent by a signed url"
    assert got["unsigned"] == 401  # envd's: no token, no signature
