"""The embedded services `aenv up` runs on a bare machine: real servers from PyPI wheels."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aioboto3
import asyncpg
import nats
import pytest

from aenv.stack import EmbeddedNats, EmbeddedPostgres, EmbeddedS3, ManagedProcess
from aenv.stack.watch import keep_running


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
            "s3",
            endpoint_url=ep.url,
            aws_access_key_id=ep.access_key,
            aws_secret_access_key=ep.secret_key,
            region_name=ep.region,
        ) as s3:
            await s3.create_bucket(Bucket="aenv-test")
            await s3.put_object(Bucket="aenv-test", Key="k", Body=b"layer-bytes")
            got = await s3.get_object(Bucket="aenv-test", Key="k")
            assert await got["Body"].read() == b"layer-bytes"
        async with session.client(
            "s3",
            endpoint_url=ep.url,
            aws_access_key_id=ep.access_key,
            aws_secret_access_key="wrong",
            region_name=ep.region,
        ) as bad:
            with pytest.raises(Exception, match=r"SignatureDoesNotMatch|AccessDenied|Forbidden"):
                await bad.get_object(Bucket="aenv-test", Key="k")
    finally:
        await svc.stop()


async def _killed_and_back(
    process: ManagedProcess, start: Callable[[], Awaitable[object]], timeout: float
) -> list[str]:
    """SIGKILL the server under `keep_running`; returns the supervisor's lines once a new
    process answers."""
    said: list[str] = []
    stop = asyncio.Event()
    watch = asyncio.create_task(keep_running(process, start, stop, said.append, cap_s=1))
    try:
        assert process.proc is not None
        old = process.proc.pid
        os.killpg(old, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while not any("is back" in line for line in said):
            assert time.monotonic() < deadline, said
            await asyncio.sleep(0.2)
        assert process.proc.pid != old
        return said
    finally:
        stop.set()
        await watch


async def test_a_killed_postgres_comes_back_with_its_data(tmp_path: Path) -> None:
    """kill -9 leaves postmaster.pid behind; the restart copes and the data is there."""
    svc = EmbeddedPostgres(tmp_path)
    url = await svc.start("aenv")
    try:
        conn = await asyncpg.connect(url)
        await conn.execute("CREATE TABLE kept (v int); INSERT INTO kept VALUES (7)")
        await conn.close()
        said = await _killed_and_back(svc.process, lambda: svc.start("aenv"), 60)
        assert any("postgres exited unexpectedly" in line for line in said)
        conn = await asyncpg.connect(url)
        assert await conn.fetchval("SELECT v FROM kept") == 7
        await conn.close()
    finally:
        await svc.stop()


@pytest.mark.slow
async def test_a_killed_seaweedfs_comes_back_with_its_objects(tmp_path: Path) -> None:
    svc = EmbeddedS3(tmp_path)
    ep = await svc.start()
    session = aioboto3.Session()

    def client() -> Any:
        return session.client(
            "s3",
            endpoint_url=ep.url,
            aws_access_key_id=ep.access_key,
            aws_secret_access_key=ep.secret_key,
            region_name=ep.region,
        )

    try:
        async with client() as s3:
            await s3.create_bucket(Bucket="aenv-kept")
            await s3.put_object(Bucket="aenv-kept", Key="k", Body=b"durable")
        await _killed_and_back(svc.process, svc.start, 120)
        async with client() as s3:
            got = await s3.get_object(Bucket="aenv-kept", Key="k")
            assert await got["Body"].read() == b"durable"
    finally:
        await svc.stop()
