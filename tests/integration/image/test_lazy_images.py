"""A lazily held image (issue 29) without a VM: the node's supervisor (`BlockService`)
runs the real block service (`python -m aenv.roles.blocks serve`) over a real repository (a
POSIX store), the shelf makes a lazy entry for an image it lacks, and QEMU's own tools read
the stub: the very bytes of the image, a few chunks fetched. The service killed -9 is back
by itself; a node process that comes back adopts it; a stop while a VM reads leaves it."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from shared.diskdigest import chunk_list
from shared.lazybase import LAZY_ROOT, base_size, is_lazy_base
from tests.integration.bus.test_fleet_shelf import _build_entry
from tests.support import eventually
from workers.node.blockservice import BlockService, answers
from workers.node.image import cache
from workers.node.image.build import GuestImage
from workers.node.image.content import content_of
from workers.node.image.lazy import LazyImages
from workers.node.image.shelf import CacheShelf
from workers.snapshot import ImageRepository, PosixStore

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mkfs of a tree needs root")


def _service(where: Path, *, in_use: bool = False) -> BlockService:
    socket = where / "blocks.sock"
    argv = [sys.executable, "-m", "aenv.roles.blocks", "serve", "--socket", str(socket)]
    argv += ["--cache-dir", str(where), "--cache-bytes", str(64 << 20)]
    return BlockService(
        argv,
        socket,
        where / "blocks.pid",
        log_file=where / "blocks.log",
        in_use=lambda: in_use,
        in_use_grace_s=0.5,
    )


def _same_bytes(stub: Path, whole: Path) -> None:
    """`qemu-img compare` of the stub (read through the service) and the image's file."""
    done = subprocess.run(
        ["qemu-img", "compare", "-U", "-f", "qcow2", "-F", "raw", str(stub), str(whole)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


async def test_a_lazy_entry_reads_the_image_through_a_supervised_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store_dir = tmp_path / "store"
    monkeypatch.delenv("AENV_S3_ENDPOINT", raising=False)
    monkeypatch.setenv("AENV_SNAPSHOT_DIR", str(store_dir))  # the service's repository
    repository = ImageRepository(PosixStore(store_dir))
    recipe = secrets.token_hex(32)
    a = cache.cache_root(tmp_path / "a")  # the node that built it
    built = _build_entry(a, recipe, recipe, "root")
    meta = json.loads((built / cache.MANIFEST).read_text())
    meta.pop("content")
    digest = built.name
    await repository.upload_image(built, recipe=recipe, role="root", meta=meta)

    where = tmp_path / "blocks"
    service = _service(where)
    await service.start()
    try:
        b = cache.cache_root(tmp_path / "b")  # the node that never held it
        shelf = CacheShelf(b, repository, "root", lazy=LazyImages(service.socket))
        entry = await shelf.fetch_content(digest)
        assert entry == b / cache.IMAGES / digest
        stub = entry / LAZY_ROOT
        assert not (entry / "root.ext4").exists() and is_lazy_base(stub)
        assert (entry / "vmlinux").read_bytes() == (built / "vmlinux").read_bytes()
        assert (
            content_of(stub) == digest and base_size(stub) == (built / "root.ext4").stat().st_size
        )
        assert GuestImage.load(entry).rootfs == stub  # a bootable entry, its disk the stub
        assert not (b / cache.RECIPES / recipe).exists()  # a recipe's entry is whole
        assert await shelf.fetch_content(digest) == entry  # held: nothing fetched again

        _same_bytes(stub, built / "root.ext4")

        # killed -9: the supervisor starts another on the same socket, and it reads again
        first = service.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)

        async def restarted() -> bool:
            return service.restarts == 1 and service.pid != first

        await eventually(restarted, timeout=20)
        assert await answers(service.socket)
        _same_bytes(stub, built / "root.ext4")

        # the same bytes fetched whole later (by recipe): beside the stub, which stays
        await shelf.fetch(recipe, digest)
        assert cache.root_disk(entry) == entry / "root.ext4" and stub.is_file()
        assert content_of(stub) == digest == chunk_list(entry / "root.ext4").digest
    finally:
        service.in_use = lambda: True
        await service.stop()  # a VM reads through it: left running
    assert await answers(service.socket)
    again = _service(where)  # the node process after a restart: adopts it
    await again.start()
    assert again.pid == service.pid
    await again.stop()  # no VM reads: it ends
    assert not await answers(again.socket)
    assert not (where / "blocks.pid").exists()
