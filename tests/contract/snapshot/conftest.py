"""Fixtures for the snapshot-store contract: every test runs against each real backend.

SeaweedFS starts once per session (it takes a few seconds); each test gets its own bucket
or directory so tests never see each other's blobs.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aenv.stack import EmbeddedS3, S3Endpoint
from workers.snapshot import PosixStore, S3Config, S3Store, SnapshotStore


@pytest.fixture(scope="session")
async def s3_endpoint() -> AsyncIterator[S3Endpoint]:
    data = Path(tempfile.mkdtemp(prefix="aenv-snapshot-s3-"))
    svc = EmbeddedS3(data)
    try:
        yield await svc.start()
    finally:
        # weed lingers ~10 s on SIGTERM; its data is throwaway, so don't wait for it.
        await svc.process.stop(timeout=1.0)
        shutil.rmtree(data, ignore_errors=True)


BUCKET = "aenv-snapshots"


def s3_config(ep: S3Endpoint, *, secret: str | None = None) -> S3Config:
    """The session's one bucket; each call gets its own key prefix, so tests never share
    blobs. (SeaweedFS gives every bucket its own volumes: a bucket per test would exhaust
    the embedded server's volume limit.)"""
    return S3Config(
        bucket=BUCKET,
        endpoint_url=ep.url,
        access_key=ep.access_key,
        secret_key=secret or ep.secret_key,
        region=ep.region,
        prefix=f"t-{uuid.uuid4().hex[:12]}",
    )


@pytest.fixture(params=["s3", "posix"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, s3_endpoint: S3Endpoint
) -> AsyncIterator[SnapshotStore]:
    impl: SnapshotStore
    if request.param == "s3":
        impl = await S3Store.open(s3_config(s3_endpoint))
    else:
        impl = PosixStore(tmp_path / "store")
    try:
        yield impl
    finally:
        await impl.close()
