"""Images built once per fleet, for real (images-at-scale S5): two nodes, each with its own
image cache, racing `FleetImages.ensure` over the real log (NATS) and the real repository
(SeaweedFS). The shelf is the node's (`CacheShelf`); only the build is small (a tree of
random files → `make_ext4`) instead of debootstrap."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from aenv.stack import S3Endpoint
from bus import Bus
from bus.store import EventStore
from domain import image as im
from domain.aggregates import IMAGE
from shared.diskdigest import chunk_list
from tests.contract.snapshot.conftest import s3_config, s3_endpoint
from tests.registry import machine_base
from workers.node.image import cache
from workers.node.image.build import GuestImage, base_recipe
from workers.node.image.content import disk_stamp, recorded_content
from workers.node.image.disk import DEFAULT_FREE, census, make_ext4, root_size
from workers.node.image.fleet import FleetImages
from workers.node.image.runtime import RuntimeDisk
from workers.node.image.shelf import CacheShelf, Role, disk_file
from workers.node.image.supply import Fleet, ImageSupply
from workers.node.metrics import NodeMetrics
from workers.snapshot import CorruptBlob, ImageRepository, S3Store, SnapshotStore

__all__ = ["s3_endpoint"]  # the session's SeaweedFS, shared with the snapshot contract

MIB = 1 << 20


@pytest.fixture
async def store(s3_endpoint: S3Endpoint) -> AsyncIterator[SnapshotStore]:
    s3 = await S3Store.open(s3_config(s3_endpoint))
    try:
        yield s3
    finally:
        await s3.close()


def _build_entry(root: Path, key: str, recipe: str, role: Role) -> Path:
    """A small image built as `build.py` builds one: a tree → ext4 in a staging dir, a
    manifest with recipe-specific fields, published by content. Another call, other bytes."""
    with cache.locked(root, key), cache.staging(root, key) as tmp:
        tree = tmp / "tree"
        (tree / "etc").mkdir(parents=True)
        (tree / "etc/hostname").write_text(f"built {secrets.token_hex(8)}\n")
        (tree / "data").write_bytes(os.urandom(9 * MIB))  # three chunks and a bit
        disk = tmp / disk_file(role)
        counted = census(tree)
        make_ext4(tree, disk, root_size(counted.need, 16 * MIB), counted=counted)
        content = chunk_list(disk)
        doc: dict[str, object] = {
            "digest": recipe,
            "content": {"digest": content.digest, **content.as_json(), "stamp": disk_stamp(disk)},
        }
        if role == "root":
            (tmp / "vmlinux").write_bytes(b"\x7fELF kernel " + os.urandom(4096))
            (tmp / "initrd.cpio").write_bytes(b"070701 initramfs " + os.urandom(2048))
            doc |= {
                "kernel_cmdline_base": "console=ttyS0 root=/dev/vda ro",
                "guest": {"user": "user", "defaults": {"env": {"LANG": "C.UTF-8"}}},
            }
        else:
            doc |= {"mount": "/opt/aenv", "label": "aenv-rt"}
        (tmp / cache.MANIFEST).write_text(json.dumps(doc))
        return cache.publish_content(root, tmp, key, content.digest)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


@dataclass
class Node:
    """One node's image cache, shelf and fleet view; what it built and fetched."""

    name: str
    root: Path
    shelf: CacheShelf
    images: FleetImages
    role: Role
    builds: int = 0
    fetches: list[tuple[int, float]] = field(default_factory=list)

    async def ensure(self, recipe: str) -> str:
        def make() -> Path:
            self.builds += 1
            return _build_entry(self.root, self.shelf.key(recipe), recipe, self.role)

        return await self.images.ensure(
            recipe, self.role, lambda: self.shelf.build(recipe, make, label="test")
        )

    def entry(self, recipe: str) -> Path | None:
        return cache.entry_dir(self.root, self.shelf.key(recipe))


def _node(bus: Bus, store: SnapshotStore, tmp_path: Path, name: str, role: Role) -> Node:
    root = cache.cache_root(tmp_path / name / "images")  # a cache of its own
    fetches: list[tuple[int, float]] = []
    shelf = CacheShelf(
        root, ImageRepository(store), role, on_fetched=lambda b, s: fetches.append((b, s))
    )
    log = EventStore(bus.js, bus.publisher, bus.settings, IMAGE)  # a process of its own
    node = Node(name, root, shelf, FleetImages(log, shelf, name, lease_s=30), role)
    node.fetches = fetches
    return node


async def _history(bus: Bus, recipe: str) -> list[str]:
    return [type(r.event).__name__ for r in await bus.images.read(im.image_aggregate_id(recipe))]


@pytest.mark.parametrize("role", ["root", "runtime"])
async def test_racing_nodes_build_once_and_hold_the_same_bytes(
    bus: Bus, store: SnapshotStore, tmp_path: Path, role: Role
) -> None:
    recipe = secrets.token_hex(32)
    a, b = (_node(bus, store, tmp_path, n, role) for n in ("a", "b"))

    digests = await asyncio.gather(a.ensure(recipe), b.ensure(recipe))

    assert digests[0] == digests[1]
    assert a.builds + b.builds == 1  # one debootstrap in the fleet
    assert await _history(bus, recipe) == ["ImageBuildClaimed", "ImagePublished"]
    builder, fetcher = (a, b) if a.builds else (b, a)
    assert len(fetcher.fetches) == 1 and not builder.fetches
    assert fetcher.fetches[0][0] > 3 * MIB  # the data chunks came over the wire

    built, fetched = builder.entry(recipe), fetcher.entry(recipe)
    assert built is not None and fetched is not None
    assert built.name == fetched.name == digests[0]  # images/<content> on both nodes
    disk_a, disk_b = built / disk_file(role), fetched / disk_file(role)
    assert _sha256(disk_a) == _sha256(disk_b)
    blocks_a, blocks_b = os.stat(disk_a).st_blocks, os.stat(disk_b).st_blocks
    assert abs(blocks_a - blocks_b) <= blocks_a * 0.1 + 2 * MIB // 512, (blocks_a, blocks_b)
    assert recorded_content(disk_b) == digests[0]  # its stamp is the fetched file's

    # the fetched entry is a complete one, with the builder's recipe-specific fields
    if role == "root":
        mine, theirs = GuestImage.load(built), GuestImage.load(fetched)
        assert theirs.digest == recipe and theirs.content_digest == digests[0]
        assert theirs.kernel_cmdline_base == mine.kernel_cmdline_base
        assert theirs.manifest["guest"] == mine.manifest["guest"]
        for name in ("vmlinux", "initrd.cpio"):
            assert _sha256(built / name) == _sha256(fetched / name)
    else:
        rt_mine, rt_theirs = RuntimeDisk.load(built), RuntimeDisk.load(fetched)
        assert rt_theirs.digest == recipe and rt_theirs.content_digest == digests[0]
        assert rt_theirs.manifest["label"] == rt_mine.manifest["label"]
    assert "fetched" in json.loads((fetched / cache.MANIFEST).read_text())

    # a third ask of either node needs neither the log nor the repository
    assert await fetcher.ensure(recipe) == digests[0]
    assert len(fetcher.fetches) == 1 and a.builds + b.builds == 1


async def test_a_corrupt_chunk_fails_the_fetch_and_leaves_no_entry(
    bus: Bus, store: SnapshotStore, tmp_path: Path
) -> None:
    recipe = secrets.token_hex(32)
    a = _node(bus, store, tmp_path, "a", "root")
    digest = await a.ensure(recipe)
    manifest = await ImageRepository(store).get_image_manifest(digest)
    chunk = next(c for c in manifest.disk.chunks if c is not None)
    await store.put_blob(chunk, os.urandom(4 * MIB))  # the store trusts the digest it is given

    b = _node(bus, store, tmp_path, "b", "root")
    with pytest.raises(CorruptBlob, match=chunk):
        await b.ensure(recipe)
    assert b.builds == 0 and not b.fetches
    assert b.entry(recipe) is None
    leftovers = [p.name for p in b.root.iterdir() if p.name not in (".locks", "images")]
    assert leftovers == []  # no staging dir, no recipes/ link
    assert not any((b.root / "images").iterdir()) if (b.root / "images").exists() else True
    assert await _history(bus, recipe) == ["ImageBuildClaimed", "ImagePublished"]


REAL_CACHE = Path("/var/lib/aenv/images")


@pytest.mark.slow
async def test_a_node_with_an_empty_cache_fetches_the_published_base(
    bus: Bus, store: SnapshotStore, tmp_path: Path
) -> None:
    """The node's own path (`ImageSupply.base`, as `aenv/roles/node.py` calls it): with the
    base published by another node, a node with an empty cache fetches it — no
    debootstrap, no kernel unpacked, no build counted — and gets a bootable entry."""
    link = REAL_CACHE / "names" / "base"
    if not (link / cache.MANIFEST).is_file():
        await asyncio.to_thread(machine_base)  # a fresh checkout gets here before test_boot
    base = link.resolve()
    recipe = GuestImage.load(base).digest
    if await asyncio.to_thread(base_recipe, REAL_CACHE, free_bytes=DEFAULT_FREE) != recipe:
        pytest.skip("this machine's base was built from other inputs than the current ones")

    # another node built it: its upload, published through the log
    publisher = _node(bus, store, tmp_path, "a", "root")
    real = CacheShelf(REAL_CACHE, ImageRepository(store), "root")
    published = await publisher.images.ensure(
        recipe, "root", lambda: real.build(recipe, lambda: base, label="base")
    )
    assert published == GuestImage.load(base).content_digest

    metrics = NodeMetrics("b")
    root = tmp_path / "b" / "images"
    fleet = Fleet(
        EventStore(bus.js, bus.publisher, bus.settings, IMAGE),
        ImageRepository(store),
        "b",
        on_fetched=metrics.image_fetched,
        on_built=metrics.image_built,
    )
    lines: list[str] = []
    image = await ImageSupply(root, fleet=fleet, progress=lines.append).base(DEFAULT_FREE)

    assert image.digest == recipe and image.content_digest == published
    assert image.rootfs.parent.parent == root / cache.IMAGES
    assert await asyncio.to_thread(lambda: chunk_list(image.rootfs).digest) == published
    assert image.kernel_cmdline_base == GuestImage.load(base).kernel_cmdline_base
    value = metrics.scrape.registry.get_sample_value
    assert value("aenv_image_fleet_builds_total", {"node": "b", "image": "base"}) == 0
    assert value("aenv_image_fetches_total", {"node": "b"}) == 1
    assert (value("aenv_image_fetch_bytes_total", {"node": "b"}) or 0) > 100 * MIB
    unpacked = [p.name for p in root.glob("*-*") if p.is_dir()]  # rootfs-*, kernel-*
    assert unpacked == []
    assert any("fetched" in line for line in lines)
