"""A decoy "internet" host for egress tests: a network namespace the test creates, linked
to the host by a veth, serving TCP on a TEST-NET-2 address (no packet goes anywhere else).

It answers every connection with the address it sees the peer as, so a test tells NATed
guest traffic (the host's address on the decoy link) from none at all. `PROBE` is the
guest side: `PROBE <ip> <port>` prints `SAW <peer>` or `BLOCKED <why>` (3 s timeout)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pyroute2 import IPRoute, NetNS, netns

__all__ = ["PROBE", "Decoy", "decoy"]

PROBE = (
    "python3 -c 'import socket,sys\n"
    "try:\n"
    "    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)\n"
    '    print("SAW", c.makefile().readline().strip())\n'
    "except OSError as e:\n"
    '    print("BLOCKED", e)\' '
)


@dataclass(frozen=True)
class Decoy:
    host_ip: str
    ip: str
    port: int

    @property
    def probe(self) -> str:
        """The guest command that dials the decoy."""
        return f"{PROBE} {self.ip} {self.port}"


def _server(ip: str, port: int) -> str:
    return (
        "import socket\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(('{ip}', {port})); s.listen()\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    c, peer = s.accept(); c.sendall(peer[0].encode() + b'\\n'); c.close()\n"
    )


@contextmanager
def decoy(
    ns_name: str,
    host_if: str,
    *,
    host_ip: str = "198.51.100.1",
    ip: str = "198.51.100.10",
    port: int = 8080,
) -> Iterator[Decoy]:
    """Namespace `ns_name` with `ip` serving on `port`, the host at `host_ip` on the other
    end of veth `host_if`; all of it removed when the block ends. Needs root."""
    ns_if = "veth0"
    netns.create(ns_name)
    server = None
    try:
        with IPRoute() as ipr:
            ipr.link(
                "add", ifname=host_if, kind="veth", peer={"ifname": ns_if, "net_ns_fd": ns_name}
            )
            idx = ipr.link_lookup(ifname=host_if)[0]
            ipr.addr("add", index=idx, address=host_ip, prefixlen=24)
            ipr.link("set", index=idx, state="up")
        with NetNS(ns_name) as ns:
            v = ns.link_lookup(ifname=ns_if)[0]
            ns.addr("add", index=v, address=ip, prefixlen=24)
            ns.link("set", index=v, state="up")
        server = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{ns_name}", sys.executable, "-c", _server(ip, port)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        yield Decoy(host_ip, ip, port)
    finally:
        if server is not None:
            server.kill()
            server.wait()
        with IPRoute() as ipr:
            for idx in ipr.link_lookup(ifname=host_if):
                ipr.link("del", index=idx)
        netns.remove(ns_name)
