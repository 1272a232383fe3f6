"""Guest egress through the host (forwarding + NAT), against a decoy "internet" host that
lives in a network namespace this test creates: no packet goes anywhere else.

The decoy answers every connection with the address it sees the peer as, so the test can
tell NATed traffic (the host's address on the decoy link) from a guest's own address.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.decoy import Decoy
from tests.decoy import decoy as decoy_host
from tests.integration.runtime.conftest import sdk
from tests.support import tagged
from workers.node.image import GuestImage
from workers.node.net import EgressPolicy
from workers.node.net.uplink import IP_FORWARD
from workers.node.runtime import Runtime, Snapshot

pytestmark = pytest.mark.vm


@pytest.fixture
def decoy() -> Iterator[Decoy]:
    """A namespace with 198.51.100.10 serving on :8080, linked to the host by a veth."""
    with decoy_host("aenvx-decoy", "aenvxd0") as d:
        yield d


async def test_allowed_egress_is_forwarded_and_natted_the_rest_stays_in(
    guest_image: GuestImage, template: Snapshot, tmp_path: Path, decoy: Decoy
) -> None:
    forward_before = IP_FORWARD.read_text()
    # its own slot range: guest addresses of this runtime never reappear as another
    # runtime's (the SDK's process-wide connection pool would reuse a dead keep-alive)
    rt = await Runtime.open(
        tmp_path / "egress",
        kernel_for_probe=guest_image.kernel,
        pool_target=0,
        slot_prefix=tagged("aenvu"),
        slot_cidr="10.214.0.0/24",
        egress=True,
    )
    try:
        allowed = EgressPolicy(internet=False, allow=("198.51.100.0/24",))
        (out, _), (closed, _) = await asyncio.gather(
            rt.restore(template, policy=allowed), rt.restore(template)
        )
        try:
            a, b = sdk(out), sdk(closed)
            seen = await asyncio.to_thread(lambda: a.commands.run(decoy.probe))
            # the decoy sees the host's address on its link: NAT, not the guest or its slot
            assert seen.stdout.strip() == f"SAW {decoy.host_ip}", seen.stdout
            shut = await asyncio.to_thread(lambda: b.commands.run(decoy.probe))
            assert shut.stdout.startswith("BLOCKED"), shut.stdout
        finally:
            await asyncio.gather(rt.destroy(out), rt.destroy(closed))
    finally:
        await rt.close()
        IP_FORWARD.write_text(forward_before)
    rules = subprocess.run(["iptables-save"], capture_output=True, text=True).stdout
    assert "AENV-AENVU" not in rules, "the uplink chains outlived the runtime"
