"""Operator actions that are pure state changes on API-side aggregates (API keys):
decided and appended directly, no node involved. Used by `aenv up`, `aenv keys` and tests.
"""

from __future__ import annotations

import contextlib
import uuid

from bus import Bus
from bus.decisions import execute
from domain import Conflict
from domain import apikey as ak
from domain.limits import Limits


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


async def ensure_api_key(bus: Bus, raw: str, *, team_id: str = "default", name: str = "") -> str:
    """Register a key the operator chose (every API process of a fleet does at start): its
    id derives from its hash, so the second registration finds the first and changes
    nothing — nor brings back a key an operator revoked since. Returns the key id."""
    if not ak.is_well_formed(raw):
        raise ValueError(
            "AENV_API_KEY must be e2b_ and at least 32 lowercase hex digits "
            "(aenv keys create prints one)"
        )
    digest = ak.hash_api_key(raw)
    key_id = f"op{digest[:14]}"
    state, _ = await bus.api_keys.load(key_id)
    if state is None:
        cmd = ak.CreateApiKey(
            key_id=key_id,
            team_id=team_id,
            name=name,
            prefix=ak.display_prefix(raw),
            key_sha256=digest,
        )
        with contextlib.suppress(Conflict):  # another API registered it meanwhile
            await execute(bus.api_keys, cmd)
    return key_id


async def revoke_api_key(bus: Bus, key_id: str) -> None:
    await execute(bus.api_keys, ak.RevokeApiKey(key_id=key_id))


async def set_key_limits(bus: Bus, key_id: str, limits: Limits) -> None:
    """Set a key's admission overrides (`api/admission.py`); empty `limits` drops them."""
    await execute(bus.api_keys, ak.SetApiKeyLimits(key_id=key_id, limits=limits))
