"""API keys on every control-plane route but `/health` (design §8).

Keys are stored hashed (sha256) in the `api_keys` read model; a lookup result is cached for
a few seconds so a burst of SDK calls costs one query, and a revocation takes effect within
that window.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from aenv.domain.apikey import hash_api_key
from api.errors import ApiError
from projections import tables

CACHE_S = 5.0
HEADER = "x-api-key"


@dataclass(frozen=True)
class Caller:
    key_id: str
    team_id: str


class KeyChecker:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._cache: dict[str, tuple[float, Caller | None]] = {}

    async def caller(self, raw: str | None) -> Caller:
        if not raw:
            raise ApiError(401, "missing API key: set the X-API-KEY header (E2B_API_KEY)")
        digest = hash_api_key(raw)
        hit = self._cache.get(digest)
        now = time.monotonic()
        if hit is None or now - hit[0] > CACHE_S:
            t = tables.api_keys
            async with self.engine.connect() as conn:
                row = (
                    await conn.execute(
                        select(t.c.key_id, t.c.team_id).where(
                            t.c.key_sha256 == digest, t.c.revoked_at.is_(None)
                        )
                    )
                ).first()
            hit = (now, Caller(row.key_id, row.team_id) if row else None)
            self._cache[digest] = hit
        if hit[1] is None:
            raise ApiError(401, "invalid API key")
        return hit[1]
