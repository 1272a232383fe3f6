"""The sandbox's own env vars (`Sandbox.create(envs=...)`), which every execution gets
under its request's `env_vars`, as E2B's code interpreter gives them: read from envd's
`GET /envs` on this guest (no token: envd answers a process of the guest itself).

Read once per sandbox, not per execution: the answer is kept with the hostname it was read
under, and envd's `/init` names the host after each new sandbox (a create, a warm VM's
claim, a fork child, a restore of a snapshot), so a new sandbox reads its own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket

log = logging.getLogger("codeint")

ENVD = ("127.0.0.1", 49983)
TIMEOUT_S = 5.0


class SandboxEnv:
    def __init__(self, address: tuple[str, int] = ENVD) -> None:
        self.address = address
        self._host: str | None = None
        self._env: dict[str, str] = {}

    async def get(self) -> dict[str, str]:
        host = socket.gethostname()
        if host != self._host:
            env = await self._read()
            if env is not None:  # envd not answering: try again next time
                self._host, self._env = host, env
        return dict(self._env)

    async def _read(self) -> dict[str, str] | None:
        host, port = self.address
        try:
            async with asyncio.timeout(TIMEOUT_S):
                reader, writer = await asyncio.open_connection(host, port)
                try:
                    writer.write(
                        f"GET /envs HTTP/1.1\r\nHost: {host}:{port}\r\n"
                        "Connection: close\r\n\r\n".encode()
                    )
                    raw = await reader.read()
                finally:
                    writer.close()
        except (OSError, TimeoutError) as e:
            log.warning("envd's /envs did not answer: %s", e)
            return None
        head, _, body = raw.partition(b"\r\n\r\n")
        if b" 200 " not in head.split(b"\r\n", 1)[0] + b" ":
            log.warning("envd's /envs answered %r", head[:80])
            return None
        try:
            if b"chunked" in head.lower():
                body = _unchunk(body)
            doc = json.loads(body)
        except ValueError as e:
            log.warning("envd's /envs sent no JSON: %s", e)
            return None
        if not isinstance(doc, dict):
            return None
        return {str(k): str(v) for k, v in doc.items() if isinstance(v, str)}


def _unchunk(body: bytes) -> bytes:
    out, rest = b"", body
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out, rest = out + rest[:size], rest[size + 2 :]
    return out
