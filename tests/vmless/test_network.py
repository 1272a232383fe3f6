"""`Sandbox.update_network` (E2B `PUT /sandboxes/{id}/network`) through the real control
plane with the unchanged SDK: the rules it sends replace the sandbox's egress rules (a
field left out cleared), `get_info` shows them, the log holds a `SandboxNetworkUpdated`,
they stay across a pause and resume, and bad rules, an unknown sandbox and a paused one
answer E2B's error bodies. (The firewall of a real VM obeying them: `tests/e2e`.)"""

from __future__ import annotations

import json

import pytest
from e2b import Sandbox, SandboxException
from e2b.exceptions import NotFoundException

from tests.vmless.conftest import VmlessStack

pytestmark = pytest.mark.usefixtures("sdk_env")


def _egress(sbx: Sandbox) -> tuple[bool | None, list[str], list[str]]:
    info = sbx.get_info()
    net = info.network or {}
    return info.allow_internet_access, net.get("allow_out", []), net.get("deny_out", [])


def test_an_update_replaces_the_rules_and_is_in_the_log(vmless: VmlessStack) -> None:
    sbx = Sandbox.create(
        timeout=120,
        allow_internet_access=False,
        network={"allow_out": ["198.51.100.10"], "allow_public_traffic": False},
    )
    try:
        assert _egress(sbx) == (False, ["198.51.100.10"], [])
        sbx.update_network({"deny_out": ["0.0.0.0/0"]})
        # allowOut left out is cleared, allow_internet_access back to its default (true)
        assert _egress(sbx) == (True, [], ["0.0.0.0/0"])
        assert (sbx.get_info().network or {}).get("allow_public_traffic") is False  # ingress
        sbx.update_network({"allow_out": ["198.51.100.0/24"], "allow_internet_access": False})
        assert _egress(sbx) == (False, ["198.51.100.0/24"], [])
        printed = vmless.aenv("events", sbx.sandbox_id, "--data-dir", str(vmless.data_dir))
        events = [json.loads(ln) for ln in printed.stdout.splitlines() if ln.startswith("{")]
        updates = [e for e in events if e["type"] == "SandboxNetworkUpdated"]
        assert len(updates) == 2, printed.stdout
    finally:
        sbx.kill()


def test_the_rules_stay_across_pause_and_resume(vmless: VmlessStack) -> None:
    sbx = Sandbox.create(timeout=120)
    sid = sbx.sandbox_id
    try:
        sbx.update_network({"deny_out": ["0.0.0.0/0"], "allow_internet_access": False})
        assert sbx.pause()
        assert _egress(sbx) == (False, [], ["0.0.0.0/0"])
        with vmless.client() as c:
            # a paused sandbox is a conflict (E2B's orchestrator: 409 when not running)
            r = c.put(f"/sandboxes/{sid}/network", json={})
            assert r.status_code == 409, r.text
            assert r.json()["code"] == 409 and "paused" in r.json()["message"]
        with pytest.raises(SandboxException, match="409"):
            sbx.update_network({})
        resumed = Sandbox.connect(sid, timeout=120)
        assert resumed.get_info().state == "running"
        assert _egress(resumed) == (False, [], ["0.0.0.0/0"])
    finally:
        sbx.kill()


def test_bad_rules_are_a_400_and_change_nothing(vmless: VmlessStack) -> None:
    sbx = Sandbox.create(timeout=120, network={"allow_out": ["198.51.100.10"]})
    try:
        with vmless.client() as c:
            for body in (
                {"allowOut": ["example.com"]},
                {"denyOut": ["10.0.0.0/33"]},
                {"denyOut": ["2001:db8::/32"]},
                {"allowOut": "1.1.1.1"},
            ):
                r = c.put(f"/sandboxes/{sbx.sandbox_id}/network", json=body)
                assert r.status_code == 400, (body, r.text)
                assert r.json()["code"] == 400 and r.json()["message"], r.text
        with pytest.raises(SandboxException, match="400"):
            sbx.update_network({"allow_out": ["not-an-address"]})
        assert _egress(sbx) == (True, ["198.51.100.10"], [])
    finally:
        sbx.kill()


def test_an_unknown_sandbox_is_not_found(vmless: VmlessStack) -> None:
    with pytest.raises(NotFoundException):
        Sandbox.update_network("nosuchsandbox0000000", {"deny_out": ["0.0.0.0/0"]})
    with vmless.client() as c:
        r = c.put("/sandboxes/nosuchsandbox0000000/network", json={})
        assert r.status_code == 404 and r.json()["code"] == 404
