"""Sandboxes as the API shows them, with what the SDK's `SandboxInfo` leaves out — aenv's
`pausedAt` and `remainingS` of a paused sandbox (the seconds it runs once resumed: its
`endAt` is the end it had when paused), `nodeID`, `forkedFrom`, `diskSizeMB`, `lifecycle` —
and the one way the CLI resumes a sandbox: with the time it kept.

Requests go through the SDK's own generated API client (its headers, retries and error
mapping), only the answer is read as the JSON it is, so `sdk_errors` maps failures as for
any SDK call.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from e2b import Sandbox

    from aenv.config import Connection

__all__ = ["connect", "detail", "listing"]

#: a page of `GET /v2/sandboxes` (the API's maximum)
PAGE = 100


def _client(conn: Connection) -> Any:
    from e2b import ConnectionConfig
    from e2b.api.client_sync import get_api_client

    return get_api_client(ConnectionConfig(**conn.sdk_opts()))


def _body(res: Any, sandbox_id: str | None = None) -> Any:
    """The answer's JSON, or the SDK's exception for its status (a 404 of one sandbox is
    the SDK's SandboxNotFoundException, as `Sandbox.get_info` raises)."""
    from e2b import SandboxNotFoundException
    from e2b.api import handle_api_exception

    if res.status_code == 404 and sandbox_id is not None:
        raise SandboxNotFoundException(f"Sandbox {sandbox_id} not found")
    if res.status_code >= 300:
        raise handle_api_exception(res)
    return json.loads(res.content)


def detail(sandbox_id: str, conn: Connection) -> dict[str, Any]:
    """`GET /sandboxes/{id}`: every field the API sends, under its wire name."""
    from e2b.api.client.api.sandboxes import get_sandboxes_sandbox_id

    res = get_sandboxes_sandbox_id.sync_detailed(sandbox_id, client=_client(conn))
    body: dict[str, Any] = _body(res, sandbox_id)
    return body


def listing(
    conn: Connection, *, states: Sequence[str] = (), metadata: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Every page of `GET /v2/sandboxes` (running and paused unless `states` says), with
    the metadata filter encoded as the SDK's `Sandbox.list` does."""
    import urllib.parse

    from e2b.api.client.api.sandboxes import get_v2_sandboxes
    from e2b.api.client.models.sandbox_state import SandboxState
    from e2b.api.client.types import UNSET

    meta = (
        urllib.parse.urlencode(
            {urllib.parse.quote(k): urllib.parse.quote(v) for k, v in metadata.items()}
        )
        if metadata
        else UNSET
    )
    wanted = [SandboxState(s) for s in states] if states else UNSET
    client, rows = _client(conn), []
    token: str | None = None
    while True:
        res = get_v2_sandboxes.sync_detailed(
            client=client, metadata=meta, state=wanted, limit=PAGE, next_token=token or UNSET
        )
        rows.extend(_body(res))
        token = res.headers.get("x-next-token")
        if not token:
            return rows


def connect(sandbox_id: str, conn: Connection, timeout: int | None = None) -> Sandbox:
    """A handle on the sandbox with its envd token, resuming it if it is paused — for the
    `timeout` given, else for the time it kept (`remainingS`: what `aenv ls` and `aenv
    timeout` show). `Sandbox.connect` without a timeout would resume it for the API's
    default 300 s, whatever it had left. A running sandbox's TTL is only ever extended, to
    `timeout` (or the API's default) if that is longer."""
    from e2b import Sandbox

    if timeout is None:
        timeout = detail(sandbox_id, conn).get("remainingS")
    return Sandbox.connect(sandbox_id, timeout=timeout, **conn.sdk_opts())
