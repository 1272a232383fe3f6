"""The build sandbox's envd, reached like any SDK user reaches it: through the API's envd
proxy (`E2b-Sandbox-Id` routing) with the sandbox's access token. The builder owns no VM
and knows no node: it drives the guest over the same path every client takes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
from e2b import AsyncSandbox, CommandExitException
from e2b.connection_config import ConnectionConfig
from packaging.version import Version

__all__ = ["BuildGuest", "CommandFailed"]

ENVD_PORT = 49983


class CommandFailed(Exception):
    def __init__(self, exit_code: int, tail: str) -> None:
        super().__init__(f"exit code {exit_code}" + (f": {tail}" if tail else ""))
        self.exit_code = exit_code


class BuildGuest:
    """Run commands, write files and set envd defaults in one build sandbox."""

    def __init__(self, proxy_url: str, sandbox_id: str, envd_version: str, token: str | None):
        self.proxy_url = proxy_url.rstrip("/")
        self.headers = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": str(ENVD_PORT)}
        if token:
            self.headers["X-Access-Token"] = token
        config = ConnectionConfig(
            api_url=self.proxy_url,
            sandbox_url=self.proxy_url,
            api_key="e2b_builder",
            extra_sandbox_headers=dict(self.headers),
            request_timeout=60,
        )
        # The SDK's own constructor (no API round trip): we already know id, version, token.
        self.sbx = AsyncSandbox(
            sandbox_id=sandbox_id,
            sandbox_domain=None,
            envd_version=Version(envd_version),
            envd_access_token=token,
            traffic_access_token=None,
            connection_config=config,
        )

    async def run(
        self,
        cmd: str,
        *,
        user: str,
        cwd: str | None,
        envs: dict[str, str],
        timeout: float,
        output: Callable[[str, str], None],
    ) -> None:
        """Run `cmd` to completion; lines go to `output(stream, line)`; CommandFailed on a
        non-zero exit (with the last stderr line, the usual culprit)."""
        last_err: list[str] = []

        def err(line: str) -> None:
            lines = [x.strip() for x in line.splitlines() if x.strip()]
            last_err[:] = lines[-1:] or last_err
            output("stderr", line)

        try:
            await self.sbx.commands.run(
                cmd,
                user=user,
                cwd=cwd,
                envs=envs,
                timeout=timeout,
                on_stdout=lambda s: output("stdout", s),
                on_stderr=err,
            )
        except CommandExitException as e:
            raise CommandFailed(e.exit_code, last_err[0] if last_err else "") from e

    async def start(self, cmd: str, *, user: str, cwd: str | None, envs: dict[str, str]) -> None:
        """Start `cmd` in the background; it keeps running into the snapshot."""
        await self.sbx.commands.run(cmd, background=True, user=user, cwd=cwd, envs=envs)

    async def write(self, path: str, data: bytes) -> None:
        await self.sbx.files.write(path, data, user="root")

    async def set_defaults(self, envs: dict[str, str], user: str, workdir: str | None) -> None:
        """envd's `/init`: what every sandbox of the template inherits (the capture keeps
        it; a sandbox's own env vars are merged over these at its restore)."""
        body: dict[str, Any] = {"envVars": envs, "defaultUser": user}
        if workdir:
            body["defaultWorkdir"] = workdir
        async with httpx.AsyncClient(timeout=30) as client:
            r = await client.post(f"{self.proxy_url}/init", json=body, headers=self.headers)
        if r.status_code >= 300:
            raise CommandFailed(r.status_code, f"envd /init refused: {r.text[:200]}")
