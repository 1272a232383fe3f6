"""Operator actions that are pure state changes on API-side aggregates (API keys):
decided and appended directly, no node involved. Used by `aenv up`, `aenv keys` and tests.
"""

from __future__ import annotations

import uuid

from bus import Bus
from bus.decisions import execute
from domain import apikey as ak


async def create_api_key(bus: Bus, *, team_id: str = "default", name: str = "") -> tuple[str, str]:
    """Mint a key; returns (key_id, plaintext). The plaintext is never stored anywhere."""
    raw = ak.new_api_key()
    key_id = uuid.uuid4().hex[:16]
    cmd = ak.CreateApiKey(
        key_id=key_id,
        team_id=team_id,
        name=name,
        prefix=ak.display_prefix(raw),
        key_sha256=ak.hash_api_key(raw),
    )
    await execute(bus.api_keys, cmd)
    return key_id, raw


async def revoke_api_key(bus: Bus, key_id: str) -> None:
    await execute(bus.api_keys, ak.RevokeApiKey(key_id=key_id))
