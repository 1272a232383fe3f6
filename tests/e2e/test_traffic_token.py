"""E2B's private ingress with a real VM and the unchanged SDK: a sandbox created with
`network={"allow_public_traffic": False}` serves its guest ports only to requests that
carry its traffic access token (`e2b-traffic-access-token`), while envd — which checks its
own token — goes on working for the SDK, which never sends the traffic token there."""

from __future__ import annotations

import httpx
import pytest
from e2b import Sandbox

from tests.e2e.conftest import Stack
from tests.support import eventually_sync

pytestmark = pytest.mark.vm

PORT = 8000


def _guest_port(sbx: Sandbox, token: str | None) -> httpx.Response:
    """GET the guest's port as the SDK addresses it: the sandbox URL (`E2B_SANDBOX_URL`
    here, the shared-host form) with E2B's routing headers, as code-interpreter does."""
    url = sbx.connection_config.get_sandbox_url(sbx.sandbox_id, sbx.sandbox_domain, PORT)
    headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": str(PORT)}
    if token is not None:
        headers["e2b-traffic-access-token"] = token
    return httpx.get(url.rstrip("/") + "/", headers=headers, timeout=30)


def test_a_private_sandbox_serves_its_ports_only_with_its_token(stack: Stack) -> None:
    sbx = Sandbox.create(timeout=300, network={"allow_public_traffic": False})
    try:
        token = sbx.traffic_access_token
        assert token, "create answered no trafficAccessToken"
        # envd's port is not asked for it: the SDK works as for any sandbox
        sbx.commands.run(f"cd /tmp && python3 -m http.server {PORT} >/dev/null 2>&1 &")
        eventually_sync(lambda: _guest_port(sbx, token).status_code == 200, timeout=30)
        r = _guest_port(sbx, None)
        assert r.status_code == 403
        assert r.json() == {
            "sandboxId": sbx.sandbox_id,
            "code": 403,
            "message": "Sandbox is secured with traffic access token. "
            "Token header 'e2b-traffic-access-token' is missing",
        }
        r = _guest_port(sbx, token + "x")
        assert r.status_code == 403 and "is invalid" in r.json()["message"]
        assert _guest_port(sbx, token).status_code == 200
        # what the SDK keeps is what connect answers
        assert Sandbox.connect(sbx.sandbox_id, timeout=300).traffic_access_token == token
    finally:
        sbx.kill()


def test_a_public_sandbox_serves_its_ports_to_anyone(stack: Stack) -> None:
    sbx = Sandbox.create(timeout=300)
    try:
        assert sbx.traffic_access_token is None
        sbx.commands.run(f"cd /tmp && python3 -m http.server {PORT} >/dev/null 2>&1 &")
        eventually_sync(lambda: _guest_port(sbx, None).status_code == 200, timeout=30)
    finally:
        sbx.kill()
