"""A guest port that is not listening yet, through the real sandbox proxy: the proxy dials
again while the port refuses, as E2B's does (five attempts, 100 to 400 ms apart), so a
server that starts listening within a second of the request answers it — a server just
started, or one in a sandbox the request has just woken (E2B's JS SDK test "auto-resume
wakes paused sandbox on http request" asks for a port right after the resume). A port
that never opens is still E2B's 502 "port is not open", after those attempts.

Real parts over loopback: the route in the real NATS KV bucket, the API's `RouteTable` and
`SandboxProxy` served by uvicorn, a socket bound to a port that starts listening late.
"""

from __future__ import annotations

import asyncio
import socket
import time

from bus import Bus
from shared.proxy.stream import DIAL_BACKOFF_S
from tests.integration.bus.test_proxy_ingress import Guest, Proxy, _get, _route, proxy, serving

__all__ = ["proxy"]  # the fixture, imported for pytest


def _bound() -> socket.socket:
    """A port that refuses connections until it is listened on (bound, not listening)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    return sock


async def test_a_port_that_opens_within_the_retries_answers(bus: Bus, proxy: Proxy) -> None:
    sid = await _route(bus, private=False)
    sock = _bound()
    port = sock.getsockname()[1]
    start = time.monotonic()
    request = asyncio.create_task(_get(proxy.url, sid, port))
    await asyncio.sleep(0.35)  # the first attempts are refused
    assert not request.done()
    guest = Guest()
    async with serving(guest, sock):  # asyncio listens on the bound socket
        r = await request
    assert r.status_code == 200, r.text
    assert r.json() == {"path": "/hello"}
    assert guest.seen == ["/hello"]
    assert time.monotonic() - start < sum(DIAL_BACKOFF_S) + 1


async def test_a_port_that_never_opens_is_not_open_after_the_retries(
    bus: Bus, proxy: Proxy
) -> None:
    sid = await _route(bus, private=False)
    sock = _bound()
    port = sock.getsockname()[1]
    try:
        start = time.monotonic()
        r = await _get(proxy.url, sid, port)
        took = time.monotonic() - start
    finally:
        sock.close()
    assert r.status_code == 502
    assert r.json() == {
        "sandboxId": sid,
        "code": 502,
        "message": f"The sandbox is running but port is not open ({port})",
    }
    assert sum(DIAL_BACKOFF_S) <= took < sum(DIAL_BACKOFF_S) + 2
