"""Operator actions that are pure state changes on API-side aggregates (API keys):
decided and appended directly, no node involved. Used by `aenv up`, `aenv keys` and tests.
"""

from __future__ import annotations

import uuid

from bus import Bus
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
    state, version = await bus.api_keys.load(key_id)
    await bus.api_keys.append(key_id, version, ak.decide_api_key(state, cmd))
    return key_id, raw


async def revoke_api_key(bus: Bus, key_id: str) -> None:
    state, version = await bus.api_keys.load(key_id)
    events = ak.decide_api_key(state, ak.RevokeApiKey(key_id=key_id))
    if events:
        await bus.api_keys.append(key_id, version, events)
