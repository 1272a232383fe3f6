"""API keys on every control-plane route but `/health` (design §8).

Keys are stored hashed (sha256) in the `api_keys` read model; a lookup result is cached for
a few seconds so a burst of SDK calls costs one query, and a revocation takes effect within
that window. Past half of it the lookup is refreshed in the background, so a steady stream
of calls never waits on the database for its key.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from api.cache import LookupCache
from api.errors import ApiError
from domain.apikey import hash_api_key
from domain.limits import Limits
from projections import tables

CACHE_S = 5.0
HEADER = "x-api-key"


@dataclass(frozen=True)
class Caller:
    key_id: str
    team_id: str
    #: The key's admission overrides (`api/admission.py`); None: it sets none.
    limits: Limits | None = None


class KeyChecker:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._cache = LookupCache(ttl=CACHE_S / 2, stale=CACHE_S)

    async def caller(self, raw: str | None) -> Caller:
        if not raw:
            raise ApiError(401, "missing API key: set the X-API-KEY header (E2B_API_KEY)")
        digest = hash_api_key(raw)
        caller: Caller | None = await self._cache.get(digest, lambda: self._lookup(digest))
        if caller is None:
            raise ApiError(401, "invalid API key")
        return caller

    async def _lookup(self, digest: str) -> Caller | None:
        t = tables.api_keys
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    select(t.c.key_id, t.c.team_id, t.c.limits).where(
                        t.c.key_sha256 == digest, t.c.revoked_at.is_(None)
                    )
                )
            ).first()
        if row is None:
            return None
        limits = Limits.model_validate(row.limits) if row.limits else None
        return Caller(row.key_id, row.team_id, limits)
