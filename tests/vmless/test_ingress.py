"""`network.allowPublicTraffic=false` through the real control plane: the create answers the
sandbox's traffic access token (E2B's `trafficAccessToken`, which the unchanged SDK keeps as
`sandbox.traffic_access_token`), connect and get answer the same one, fork children get
their own, and `aenv events` never prints it. (The proxy's check of it: the integration
test `tests/integration/bus/test_proxy_ingress.py`; end to end with a VM: `tests/e2e`.)"""

from __future__ import annotations

import json

import pytest
from e2b import Sandbox

from tests.vmless.conftest import VmlessStack

pytestmark = pytest.mark.usefixtures("sdk_env")


def test_a_private_sandbox_gets_a_traffic_token_and_keeps_it(vmless: VmlessStack) -> None:
    sbx = Sandbox.create(timeout=120, network={"allow_public_traffic": False})
    token = sbx.traffic_access_token
    assert token, "create answered no trafficAccessToken"
    sid = sbx.sandbox_id
    with vmless.client() as c:
        try:
            detail = c.get(f"/sandboxes/{sid}").json()
            assert detail["trafficAccessToken"] == token
            assert detail["network"]["allowPublicTraffic"] is False
            assert sbx.get_info().network == {
                "allow_out": [],
                "deny_out": [],
                "allow_public_traffic": False,
            }
            assert Sandbox.connect(sid, timeout=120).traffic_access_token == token
            r = c.post(f"/sandboxes/{sid}/connect", json={"timeout": 120})
            assert r.status_code == 200 and r.json()["trafficAccessToken"] == token
            r = c.post(f"/sandboxes/{sid}/fork", json={"count": 2})
            assert r.status_code == 201, r.text
            kids = [item["sandbox"] for item in r.json()]
            kid_tokens = {k["trafficAccessToken"] for k in kids}
            assert len(kid_tokens) == 2 and token not in kid_tokens  # each its own
            for k in kids:
                got = c.get(f"/sandboxes/{k['sandboxID']}").json()
                assert got["trafficAccessToken"] == k["trafficAccessToken"]
                assert got["network"]["allowPublicTraffic"] is False
            for k in kids:
                assert c.delete(f"/sandboxes/{k['sandboxID']}").status_code == 204
            printed = vmless.aenv("events", sid, "--data-dir", str(vmless.data_dir)).stdout
            lines = [json.loads(ln) for ln in printed.splitlines() if ln.startswith("{")]
            assert [e["type"] for e in lines][:2] == ["SandboxRequested", "SandboxCreated"]
            assert lines[0]["details"]["network"]["allow_public_traffic"] is False
            assert token not in printed and "traffic_access_token" not in printed
        finally:
            sbx.kill()


def test_a_public_sandbox_has_none(vmless: VmlessStack) -> None:
    """The default (and `allowPublicTraffic=true`): no token, as E2B answers."""
    for network in (None, {"allow_public_traffic": True}):
        sbx = Sandbox.create(timeout=120, network=network)  # type: ignore[arg-type]
        try:
            assert sbx.traffic_access_token is None
            with vmless.client() as c:
                detail = c.get(f"/sandboxes/{sbx.sandbox_id}").json()
            assert "trafficAccessToken" not in detail
            assert detail["network"]["allowPublicTraffic"] is True
        finally:
            sbx.kill()


def test_allow_public_traffic_must_be_a_boolean(vmless: VmlessStack) -> None:
    with vmless.client() as c:
        r = c.post(
            "/v2/sandboxes", json={"templateID": "base", "network": {"allowPublicTraffic": "maybe"}}
        )
    assert r.status_code == 400 and set(r.json()) == {"code", "message"}
