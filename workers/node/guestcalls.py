"""What the node asks a running sandbox's envd besides its /init: its measures, a flush of
its disk, the defaults it was told, the release of its volumes. Each call presents the
sandbox's access token; none may hang the caller (bounded by its timeout)."""

from __future__ import annotations

import json
import logging
from typing import Any

from workers.node.hosted import LiveSandbox
from workers.node.ports import HostError
from workers.node.runtime import ENVD_PORT, http_request

__all__ = ["call", "flush", "metrics"]

log = logging.getLogger(__name__)


def _headers(live: LiveSandbox) -> dict[str, str]:
    token = live.guest.access_token
    return {"X-Access-Token": token} if token else {}


async def metrics(live: LiveSandbox) -> dict[str, Any] | None:
    """envd's measures of the guest (CPU, memory, disk), or None if it does not answer."""
    try:
        status, body = await http_request(
            live.vm.host, ENVD_PORT, "GET", "/metrics", headers=_headers(live), timeout=2.0
        )
    except (OSError, TimeoutError, ConnectionError):
        return None
    if status != 200:
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


async def flush(live: LiveSandbox) -> dict[str, object]:
    """The guest's writes on its disk (envd /sync) and what envd was told (its defaults),
    for a filesystem-only pause. A guest that does not answer is not paused: E2B refuses a
    filesystem pause of an unresponsive guest too."""
    host, headers = live.vm.host, _headers(live)
    try:
        status, body = await http_request(
            host, ENVD_PORT, "GET", "/defaults", headers=headers, timeout=10.0
        )
        synced, _ = await http_request(
            host, ENVD_PORT, "POST", "/sync", headers=headers, timeout=60.0
        )
    except (OSError, TimeoutError, ConnectionError) as e:
        raise HostError(f"the guest did not answer for a filesystem pause: {e}") from e
    if status != 200 or synced != 200:
        raise HostError(f"the guest refused a filesystem pause ({status}, {synced})")
    doc = json.loads(body)
    return doc if isinstance(doc, dict) else {}


async def call(live: LiveSandbox, method: str, path: str, body: object, *, timeout: float) -> bool:
    """A best-effort request to a running guest's envd: whether it answered 2xx."""
    data = json.dumps(body).encode() if body is not None else b""
    try:
        status, answer = await http_request(
            live.vm.host,
            ENVD_PORT,
            method,
            path,
            headers=_headers(live),
            body=data,
            timeout=timeout,
        )
    except (OSError, TimeoutError, ConnectionError) as e:
        log.warning("sandbox %s: envd %s %s failed: %s", live.sandbox_id, method, path, e)
        return False
    if status >= 300:
        log.warning(
            "sandbox %s: envd %s %s answered %s: %s",
            live.sandbox_id,
            method,
            path,
            status,
            answer[:200],
        )
    return status < 300
