"""The e2b 1.x SDKs, unchanged, against a real VM: Python 1.3.3 (still pinned by RL stacks,
e.g. SkyRL's OpenHands agent) and 1.11.1, and JavaScript 1.13.2 — the last 1.x of each.
They know no `E2B_API_URL` nor `E2B_SANDBOX_URL`: configured only with `E2B_DOMAIN`,
`E2B_API_KEY` and the CA bundle, they reach the API at `https://api.{domain}` and envd and
`get_host(port)` at `https://{port}-{id}.{domain}`, as `tests/e2e/test_domain.py` does for
2.x. 1.3.3 also names a sandbox `{sandboxID}-{clientID}` everywhere (host names and API
paths), which E2B's API and proxy cut back to the sandbox id. Each side environment comes
from scripts/setup.sh; a missing one skips its case."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.by_name import by_name_env, last_json
from tests.e2e.conftest import Stack

pytestmark = pytest.mark.vm

ROOT = Path(__file__).resolve().parents[2]
JS = ROOT / ".npm-e2b-1"
JS_SCRIPT = Path(__file__).with_name("js") / "sdk1x.js"

SCRIPT = """
import importlib.metadata as m, json, sys, time
import httpx
from e2b import Sandbox

assert m.version("e2b") == sys.argv[1], m.version("e2b")
sbx = Sandbox(timeout=300)
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
finally:
    sbx.kill()
out["killed_again"] = Sandbox.kill(sbx.sandbox_id)  # False: it is gone
out["listed_after"] = any(s.sandbox_id == sbx.sandbox_id for s in Sandbox.list())
print(json.dumps(out))
"""


def _assert_seen(stack: Stack, got: dict[str, object]) -> None:
    sid = str(got["id"])
    assert got["host"] == f"8000-{sid}.{stack.tls_env['E2B_DOMAIN']}"
    assert got["echo"] == "hello from 1.x\n"
    assert got["read"] == "written by 1.x"
    assert got["served"] == [200, "served to 1.x\n"]
    assert got["listed"] is True
    assert got["killed_again"] is False
    assert got["listed_after"] is False


@pytest.mark.parametrize("version", ["1.3.3", "1.11.1"])
def test_python_sdk_1x_by_domain(stack: Stack, version: str) -> None:
    python = ROOT / f".venv-e2b-{version}" / "bin" / "python"
    if not python.exists():
        pytest.skip(f"{python} missing: scripts/setup.sh installs e2b {version} there")
    got = last_json([str(python), "-c", SCRIPT, version], by_name_env(stack), cwd=ROOT)
    assert got["envd_url"] == f"https://49983-{got['id']}.{stack.tls_env['E2B_DOMAIN']}"
    _assert_seen(stack, got)


def test_javascript_sdk_1x_by_domain(stack: Stack) -> None:
    if not (JS / "node_modules" / "e2b").exists():
        pytest.skip(f"{JS} missing: scripts/setup.sh installs npm e2b 1.13.2 there")
    env = by_name_env(stack) | {"NODE_PATH": str(JS / "node_modules")}
    _assert_seen(stack, last_json(["node", str(JS_SCRIPT)], env, cwd=JS))
