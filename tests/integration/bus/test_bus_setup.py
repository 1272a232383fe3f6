"""Stream and bucket set-up against a real JetStream: the nodes bucket lives on file, so a
NATS restart keeps it (as memory it vanished, and every heartbeat after failed), and a
bucket an older version made in memory is remade on file."""

from __future__ import annotations

import secrets

import nats
from nats.js.api import KeyValueConfig, StorageType

from bus import BusSettings, delete_all
from bus.setup import ensure_streams
from bus.subjects import Names

NATS_URL = "nats://127.0.0.1:4222"


async def test_a_memory_nodes_bucket_is_remade_on_file() -> None:
    settings = BusSettings(nats_url=NATS_URL, bus_prefix=f"t{secrets.token_hex(4)}")
    names = Names(settings.bus_prefix)
    nc = await nats.connect(NATS_URL)
    js = nc.jetstream()
    try:
        await js.create_key_value(
            KeyValueConfig(bucket=names.nodes_bucket, history=1, ttl=30, storage=StorageType.MEMORY)
        )
        await ensure_streams(js, settings)
        kv = await js.key_value(names.nodes_bucket)
        assert (await kv.status()).stream_info.config.storage == StorageType.FILE
        await ensure_streams(js, settings)  # and it stays so (no delete on every start)
        await kv.put("n1", b"beat")
        kv = await js.key_value(names.nodes_bucket)
        assert (await kv.get("n1")).value == b"beat"
    finally:
        await delete_all(js, settings)
        await nc.close()
