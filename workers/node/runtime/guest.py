"""Talking to envd in a guest from the node: readiness probe and the post-restore /init.

A minimal HTTP/1.1 client on asyncio streams: the probe runs every few milliseconds while
a VM restores, and its cost should be the network round trip, not a client library.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from datetime import UTC, datetime

from workers.node.vmm.errors import VmTimeout

ENVD_PORT = 49983


async def http_request(
    host: str,
    port: int,
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    timeout: float = 2.0,
) -> tuple[int, bytes]:
    """One request on a fresh connection; returns (status, body)."""
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            head = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: close"]
            head += [f"{k}: {v}" for k, v in (headers or {}).items()]
            if body or method in ("POST", "PUT"):
                head.append(f"Content-Length: {len(body)}")
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
            await writer.drain()
            raw = await reader.read()
        finally:
            writer.close()
    status_line, _, rest = raw.partition(b"\r\n")
    parts = status_line.split()
    if len(parts) < 2 or not parts[1].isdigit():
        raise ConnectionError(f"bad HTTP response from {host}:{port}: {status_line!r}")
    _, _, payload = rest.partition(b"\r\n\r\n")
    return int(parts[1]), payload


async def wait_envd(host: str, *, timeout: float, port: int = ENVD_PORT) -> float:
    """Poll envd's /health until it answers 2xx; returns seconds waited."""
    start = time.monotonic()
    last: Exception | None = None
    while time.monotonic() - start < timeout:
        try:
            status, _ = await http_request(host, port, "GET", "/health", timeout=1.0)
            if 200 <= status < 300:
                return time.monotonic() - start
            last = ConnectionError(f"/health answered {status}")
        except (OSError, TimeoutError, ConnectionError) as e:
            last = e
        await asyncio.sleep(0.005)
    raise VmTimeout(f"envd at {host}:{port} did not answer within {timeout}s ({last})")


def over_defaults(defaults: dict[str, object], init: dict[str, object] | None) -> dict[str, object]:
    """envd's /init for a cold boot of a filesystem-only capture: the capture's guest
    defaults, then the sandbox's own settings over them (its env vars win key by key)."""
    body: dict[str, object] = {**defaults, **(init or {})}
    base_env, own_env = defaults.get("envVars"), (init or {}).get("envVars")
    if isinstance(base_env, dict) and isinstance(own_env, dict):
        body["envVars"] = {**base_env, **own_env}
    return body


def init_body(**extra: object) -> dict[str, object]:
    """envd /init payload that every restore and fork sends: clock + fresh entropy.

    Restored guests keep the clock of the moment they were captured (no kvmclock under
    TCG) and forks would share RNG state; both are fixed before anyone else talks to envd.
    """
    body: dict[str, object] = {
        "timestamp": datetime.now(UTC).isoformat(),
        "entropy": base64.b64encode(os.urandom(64)).decode(),
    }
    body.update({k: v for k, v in extra.items() if v is not None})
    return body


class InitRefused(Exception):
    """envd answered /init with an error status (not a transport problem: do not retry)."""


async def init_envd(
    host: str, extra: dict[str, object] | None = None, *, token: str | None = None
) -> None:
    """POST /init once. `token` proves we know the guest's current access token (a
    restored or forked guest keeps the one it had when captured)."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["X-Access-Token"] = token
    status, payload = await http_request(
        host, ENVD_PORT, "POST", "/init", json.dumps(init_body(**(extra or {}))).encode(), headers
    )
    if status >= 300:
        raise InitRefused(f"envd /init answered {status}: {payload[:200]!r}")


async def wait_and_init(
    host: str,
    extra: dict[str, object] | None = None,
    *,
    token: str | None = None,
    timeout: float,
) -> float:
    """Initialise envd as soon as it accepts connections; returns seconds waited.

    The /init call doubles as the readiness probe: one request instead of /health then
    /init, and under TCG each first request of a restored guest is the expensive one.
    """
    start = time.monotonic()
    last: Exception | None = None
    while time.monotonic() - start < timeout:
        try:
            await init_envd(host, extra, token=token)
            return time.monotonic() - start
        except (OSError, TimeoutError, ConnectionError) as e:
            last = e
        await asyncio.sleep(0.003)
    raise VmTimeout(f"envd at {host}:{ENVD_PORT} did not accept /init within {timeout}s ({last})")


#: What a warm VM runs once before it idles: the command a sandbox's first
#: `commands.run` starts, the way the SDK starts it (a login bash), through envd's
#: process table and its streaming Connect call — so that the code path a client's first
#: command takes has run in this QEMU (its translated guest code, the guest pages it
#: touches) before any client waits on it.
WARM_COMMAND = ("/bin/bash", "-l", "-c", "true")


async def run_first_command(
    host: str,
    *,
    token: str | None,
    timeout: float = 30.0,
    argv: tuple[str, ...] = WARM_COMMAND,
) -> None:
    """Start `argv` in the guest through envd's `process.Process/Start` (Connect, JSON
    codec, server-streaming) and wait for its end event. Raises `InitRefused` on an error
    status or a stream without an end."""
    msg = json.dumps(
        {"process": {"cmd": argv[0], "args": list(argv[1:]), "envs": {}}, "stdin": False}
    ).encode()
    body = b"\x00" + len(msg).to_bytes(4, "big") + msg
    headers = {"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"}
    if token:
        headers["X-Access-Token"] = token
    status, payload = await http_request(
        host, ENVD_PORT, "POST", "/process.Process/Start", body, headers, timeout=timeout
    )
    if status != 200 or b'"end"' not in payload:
        raise InitRefused(f"envd's first command answered {status}: {payload[-200:]!r}")
