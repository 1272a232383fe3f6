"""Guest egress through the host (forwarding + NAT), against a decoy "internet" host that
lives in a network namespace this test creates: no packet goes anywhere else.

The decoy answers every connection with the address it sees the peer as, so the test can
tell NATed traffic (the host's address on the decoy link) from a guest's own address.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyroute2 import IPRoute, NetNS, netns

from tests.integration.runtime.conftest import sdk
from tests.support import tagged
from workers.node.image import GuestImage
from workers.node.net import EgressPolicy
from workers.node.net.uplink import IP_FORWARD
from workers.node.runtime import Runtime, Snapshot

pytestmark = pytest.mark.vm

DECOY_NS = "aenvx-decoy"
HOST_IF, NS_IF = "aenvxd0", "veth0"
HOST_IP, DECOY_IP, PORT = "198.51.100.1", "198.51.100.10", 8080  # TEST-NET-2, ours only
SERVER = (
    "import socket\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    f"s.bind(('{DECOY_IP}', {PORT})); s.listen()\n"
    "print('ready', flush=True)\n"
    "while True:\n"
    "    c, peer = s.accept(); c.sendall(peer[0].encode() + b'\\n'); c.close()\n"
)
PROBE = (
    "python3 -c 'import socket,sys\n"
    "try:\n"
    "    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)\n"
    '    print("SAW", c.makefile().readline().strip())\n'
    "except OSError as e:\n"
    '    print("BLOCKED", e)\' '
)


@pytest.fixture
def decoy() -> Iterator[None]:
    """A namespace with 198.51.100.10 serving on :8080, linked to the host by a veth."""
    netns.create(DECOY_NS)
    server = None
    try:
        with IPRoute() as ipr:
            ipr.link(
                "add", ifname=HOST_IF, kind="veth", peer={"ifname": NS_IF, "net_ns_fd": DECOY_NS}
            )
            idx = ipr.link_lookup(ifname=HOST_IF)[0]
            ipr.addr("add", index=idx, address=HOST_IP, prefixlen=24)
            ipr.link("set", index=idx, state="up")
        with NetNS(DECOY_NS) as ns:
            v = ns.link_lookup(ifname=NS_IF)[0]
            ns.addr("add", index=v, address=DECOY_IP, prefixlen=24)
            ns.link("set", index=v, state="up")
        server = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{DECOY_NS}", sys.executable, "-c", SERVER],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        yield
    finally:
        if server is not None:
            server.kill()
            server.wait()
        with IPRoute() as ipr:
            for idx in ipr.link_lookup(ifname=HOST_IF):
                ipr.link("del", index=idx)
        netns.remove(DECOY_NS)


async def test_allowed_egress_is_forwarded_and_natted_the_rest_stays_in(
    guest_image: GuestImage, template: Snapshot, tmp_path: Path, decoy: None
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
            seen = await asyncio.to_thread(lambda: a.commands.run(f"{PROBE} {DECOY_IP} {PORT}"))
            # the decoy sees the host's address on its link: NAT, not the guest or its slot
            assert seen.stdout.strip() == f"SAW {HOST_IP}", seen.stdout
            shut = await asyncio.to_thread(lambda: b.commands.run(f"{PROBE} {DECOY_IP} {PORT}"))
            assert shut.stdout.startswith("BLOCKED"), shut.stdout
        finally:
            await asyncio.gather(rt.destroy(out), rt.destroy(closed))
    finally:
        await rt.close()
        IP_FORWARD.write_text(forward_before)
    rules = subprocess.run(["iptables-save"], capture_output=True, text=True).stdout
    assert "AENV-AENVU" not in rules, "the uplink chains outlived the runtime"
