"""`Sandbox.update_network` against a real VM: the unchanged e2b SDK swaps a running
sandbox's egress firewall, and the guest feels it at once — its dial to a decoy host (a
network namespace this test makes, `tests/decoy.py`) goes through, is blocked after a
deny-all update, goes through again after an allow — and the rules hold across a pause and
a resume; an `allowOut` entry beats a deny-all, as in E2B.

It runs a stack of its own: the shared e2e stack keeps egress off (`AENV_EGRESS_ENABLED`),
and this one turns it on. Its sandboxes stay off the internet (`allow_internet_access`
false); the decoy is in TEST-NET-2, a range closed unless `allowOut` names it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox

from tests.decoy import Decoy, decoy
from tests.support import tagged
from tests.vmstack import running_stack

pytestmark = pytest.mark.vm

DECOY_NET = "198.51.100.0/24"
DENY_ALL = {"deny_out": ["0.0.0.0/0"], "allow_internet_access": False}
ALLOW_DECOY = {"allow_out": [DECOY_NET], "allow_internet_access": False}


@pytest.fixture(scope="module")
def egress_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Decoy]:
    """A decoy, and a stack with egress on whose SDK settings are in the environment."""
    if os.geteuid() != 0:
        pytest.skip("the stack runs microVMs and the decoy a namespace: needs root")
    data: Path = tmp_path_factory.mktemp("aenv-net")
    prefix = tagged("aenvn")
    env = {
        **os.environ,
        "AENV_SLOT_PREFIX": prefix,
        "AENV_NODE_ID": "e2e-net",
        "AENV_EGRESS_ENABLED": "1",
        "AENV_WARM_POOL_MAX": "1",
    }
    with decoy(tagged("aenvxn"), tagged("aenvxn0")) as d, running_stack(data, env, prefix):
        yield d


def _dial(sbx: Sandbox, d: Decoy) -> str:
    return sbx.commands.run(d.probe, timeout=60).stdout.strip()


def test_update_network_swaps_the_guests_firewall_and_holds_across_pause(
    egress_stack: Decoy,
) -> None:
    d = egress_stack
    sbx = Sandbox.create(
        timeout=600, allow_internet_access=False, network={"allow_out": [DECOY_NET]}
    )
    try:
        reached = f"SAW {d.host_ip}"  # the decoy sees the node's address: NAT
        assert _dial(sbx, d) == reached
        sbx.update_network(DENY_ALL)
        assert _dial(sbx, d).startswith("BLOCKED"), "deny-all did not apply at once"
        sbx.update_network(ALLOW_DECOY)
        assert _dial(sbx, d) == reached
        # the rules are the sandbox's: a pause and a resume (a new slot) keep them
        sbx.update_network(DENY_ALL)
        assert sbx.pause()
        resumed = Sandbox.connect(sbx.sandbox_id, timeout=600)
        info = resumed.get_info()
        assert info.allow_internet_access is False
        assert (info.network or {}).get("deny_out") == ["0.0.0.0/0"]
        assert _dial(resumed, d).startswith("BLOCKED"), "the resume did not keep deny-all"
        # E2B's "only X": an allowed entry beats a deny-all
        resumed.update_network({"allow_out": [DECOY_NET], "deny_out": ["0.0.0.0/0"]})
        assert _dial(resumed, d) == reached
    finally:
        sbx.kill()
