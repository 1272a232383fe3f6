"""API keys of other teams for the VM-less tests, handed out only once the API can see them."""

from __future__ import annotations

import asyncio

import asyncpg

from api.admin import create_api_key
from bus import Bus
from tests.vmless.conftest import VmlessStack


def minted_key(stack: VmlessStack, team: str, name: str = "a test's key") -> tuple[str, str]:
    """A new key of `team` as (key id, plaintext), returned once the API's read model holds
    it: a key used before that is a 401 the API caches for a while (a flake seen under load)."""

    async def mint() -> tuple[str, str]:
        bus = await Bus.connect(stack.bus_settings, setup=False)
        try:
            key_id, raw = await create_api_key(bus, team_id=team, name=name)
        finally:
            await bus.close()
        db = await asyncpg.connect(stack.env["AENV_DATABASE_URL"])
        try:
            for _ in range(300):
                if await db.fetchval("SELECT 1 FROM api_keys WHERE key_id = $1", key_id):
                    return key_id, raw
                await asyncio.sleep(0.05)
        finally:
            await db.close()
        raise AssertionError(f"key {key_id} never reached the read model")

    return asyncio.run(mint())
