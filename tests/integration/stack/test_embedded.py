"""The embedded services `aenv up` runs on a bare machine: real servers from PyPI wheels."""

from __future__ import annotations

from pathlib import Path

import aioboto3
import asyncpg
import nats
import pytest

from aenv.stack import EmbeddedNats, EmbeddedPostgres, EmbeddedS3


async def test_embedded_nats_has_jetstream_and_avoids_taken_ports(tmp_path: Path) -> None:
    svc = EmbeddedNats(tmp_path)
    assert svc.port != 4222
    url = await svc.start()
    try:
        nc = await nats.connect(url)
        info = await nc.jetstream().account_info()
        assert info.limits is not None
        await nc.close()
    finally:
        await svc.stop()
    assert svc.process.proc is not None and svc.process.proc.poll() is not None


async def test_embedded_postgres_creates_its_database(tmp_path: Path) -> None:
    svc = EmbeddedPostgres(tmp_path)
    assert svc.port != 5432
    url = await svc.start("aenv")
    try:
        conn = await asyncpg.connect(url)
        assert await conn.fetchval("SELECT current_database()") == "aenv"
        await conn.close()
    finally:
        await svc.stop()
    # restart on the same data dir keeps the cluster
    again = EmbeddedPostgres(tmp_path)
    await again.start("aenv")
    await again.stop()


@pytest.mark.slow
async def test_embedded_s3_round_trips_an_object(tmp_path: Path) -> None:
    svc = EmbeddedS3(tmp_path)
    ep = await svc.start()
    try:
        session = aioboto3.Session()
        async with session.client(
            "s3", endpoint_url=ep.url, aws_access_key_id=ep.access_key,
            aws_secret_access_key=ep.secret_key, region_name=ep.region,
        ) as s3:  # fmt: skip
            await s3.create_bucket(Bucket="aenv-test")
            await s3.put_object(Bucket="aenv-test", Key="k", Body=b"layer-bytes")
            got = await s3.get_object(Bucket="aenv-test", Key="k")
            assert await got["Body"].read() == b"layer-bytes"
        async with session.client(
            "s3", endpoint_url=ep.url, aws_access_key_id=ep.access_key,
            aws_secret_access_key="wrong", region_name=ep.region,
        ) as bad:  # fmt: skip
            with pytest.raises(Exception, match=r"SignatureDoesNotMatch|AccessDenied|Forbidden"):
                await bad.get_object(Bucket="aenv-test", Key="k")
    finally:
        await svc.stop()
