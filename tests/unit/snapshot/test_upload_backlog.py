"""A failed upload is not silent: it waits in the backlog (reported by the heartbeat) with
a warning naming the whole backlog, until it is uploaded or moot."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

import pytest

from workers.snapshot.backlog import UploadBacklog
from workers.snapshot.worker import SnapshotWorker


def test_the_oldest_first_failure_is_what_counts() -> None:
    b = UploadBacklog()
    assert b.summary(100.0) == (0, 0.0)
    b.failed("sbx-a", 10.0)
    b.failed("sbx-b", 30.0)
    b.failed("sbx-a", 50.0)  # a retry failing again keeps its first failure's time
    assert b.summary(70.0) == (2, 60.0)
    b.settled("sbx-a")
    assert b.summary(70.0) == (1, 40.0)


@dataclass(frozen=True)
class _Capture:
    snapshot_id: str
    dir: Path
    base_image_digest: str = "sha256:base"
    size_bytes: int = 1
    volumes: tuple[tuple[int, str, Path], ...] = ()
    image_bytes: int = 2


class _Repository:
    """The repository port with S3 down, then back."""

    def __init__(self) -> None:
        self.down = True

    async def upload(
        self, snapshot_dir: Path, *, base_image_digest: str, snapshot_id: str
    ) -> object:
        if self.down:
            raise ConnectionRefusedError("connect to 127.0.0.1:9 refused")
        return "stored"


async def test_a_failed_upload_waits_in_the_backlog_until_it_succeeds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    repo = _Repository()
    worker = SnapshotWorker(bus=None, node_id="n1", captures=None, repository=repo)  # type: ignore[arg-type]
    capture = _Capture("snap-1", tmp_path)
    with caplog.at_level(logging.WARNING), pytest.raises(ConnectionRefusedError):
        await worker._upload("sbx-1", capture)
    waiting, oldest = worker.waiting()
    assert waiting == 1 and oldest >= 0
    assert "1 capture waiting for upload" in caplog.text and "snap-1" in caplog.text
    await asyncio.sleep(0.01)
    repo.down = False
    assert await worker._upload("sbx-1", capture) is True
    assert worker.waiting() == (0, 0.0)
