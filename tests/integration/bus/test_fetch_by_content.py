"""Disks fetched by content (issue 41): a capture names the bytes it was taken over, and a
node that lacks them gets exactly those from the repository (`CacheShelf.fetch_content`,
through `ImageSupply.by_content`, which `Transfers` calls before stacking a capture of
another node). Real NATS and SeaweedFS, two nodes with caches of their own; the images
are small ones built as `build.py` builds them (`test_fleet_shelf._build_entry`)."""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aenv.stack import S3Endpoint
from bus import Bus
from bus.store import EventStore
from domain.aggregates import IMAGE
from shared.diskdigest import chunk_list
from tests.contract.snapshot.conftest import s3_config, s3_endpoint
from tests.integration.bus.test_fleet_shelf import _build_entry, _node, _sha256
from workers.node.image import cache
from workers.node.image.build import GuestImage
from workers.node.image.content import content_of
from workers.node.image.shelf import Role, disk_file
from workers.node.image.supply import Fleet, ImageSupply
from workers.snapshot import ImageRepository, S3Store, SnapshotStore

__all__ = ["s3_endpoint"]  # the session's SeaweedFS, shared with the snapshot contract


@pytest.fixture
async def store(s3_endpoint: S3Endpoint) -> AsyncIterator[SnapshotStore]:
    s3 = await S3Store.open(s3_config(s3_endpoint))
    try:
        yield s3
    finally:
        await s3.close()


@pytest.mark.parametrize("role", ["root", "runtime"])
async def test_bytes_a_node_lacks_are_fetched_by_content_beside_its_own(
    bus: Bus, store: SnapshotStore, tmp_path: Path, role: Role
) -> None:
    """Node B holds its own build of the recipe (other bytes); a capture of node A names
    A's bytes: B fetches exactly those into `images/<content>`, and its recipe still names
    its own build (its templates and new VMs run on that)."""
    recipe = secrets.token_hex(32)
    a = _node(bus, store, tmp_path, "a", role)
    published = await a.ensure(recipe)  # built on A and uploaded as image-<content>
    b = _node(bus, store, tmp_path, "b", role)
    own = _build_entry(b.root, b.shelf.key(recipe), recipe, role)  # B's own build, no fleet
    assert own.name != published

    got = await b.shelf.fetch_content(published)

    assert got == b.root / cache.IMAGES / published
    a_entry = a.entry(recipe)
    assert a_entry is not None
    assert _sha256(got / disk_file(role)) == _sha256(a_entry / disk_file(role))
    assert content_of(got / disk_file(role)) == published  # recorded, and true
    assert chunk_list(got / disk_file(role)).digest == published
    assert b.entry(recipe) == own  # the recipe did not move
    doc = json.loads((got / cache.MANIFEST).read_text())
    assert doc["digest"] == recipe and "fetched" in doc
    if role == "root":
        assert GuestImage.load(got).content_digest == published  # a bootable entry
        assert (got / "vmlinux").is_file() and (got / "initrd.cpio").is_file()
    assert len(b.fetches) == 1

    # held now: no second download; bytes nowhere: None (the caller's refusal names them)
    assert await b.shelf.fetch_content(published) == got
    assert len(b.fetches) == 1
    assert await b.shelf.fetch_content(secrets.token_hex(32)) is None
    leftovers = [p.name for p in b.root.iterdir() if p.name.startswith(".tmp-")]
    assert leftovers == []


async def test_a_node_without_the_recipe_gets_it_linked(
    bus: Bus, store: SnapshotStore, tmp_path: Path
) -> None:
    """Through the node's `ImageSupply.by_content`: a node that never had the recipe (an
    empty cache) fetches the bytes and its `recipes/` names them from then on."""
    recipe = secrets.token_hex(32)
    a = _node(bus, store, tmp_path, "a", "runtime")
    published = await a.ensure(recipe)
    root = tmp_path / "c" / "images"
    fleet = Fleet(
        EventStore(bus.js, bus.publisher, bus.settings, IMAGE), ImageRepository(store), "c"
    )
    supply = ImageSupply(root, fleet=fleet)

    got = await supply.by_content("runtime", published)

    assert got == root / cache.IMAGES / published
    assert cache.entry_dir(root, f"runtime-{recipe}") == got
    # the root shelf refuses a runtime disk: the roles are not interchangeable
    other = secrets.token_hex(32)
    c = _node(bus, store, tmp_path, "d", "root")
    root_published = await c.ensure(other)
    with pytest.raises(Exception, match="not a runtime image"):
        await supply.by_content("runtime", root_published)
    assert cache.content_dir(root, root_published) is None
    # without a repository, only what the cache holds
    assert await ImageSupply(root).by_content("runtime", published) == got
    assert await ImageSupply(root).by_content("root", root_published) is None


def test_the_shelf_names_no_recipe_for_bytes_fetched_by_content(tmp_path: Path) -> None:
    """`publish_content(recipe=None)`: the entry by content, no `recipes/` link."""
    root = cache.cache_root(tmp_path / "images")
    with cache.staging(root, "x") as tmp:
        (tmp / "runtime.ext4").write_bytes(b"\0" * 4096)
        (tmp / cache.MANIFEST).write_text("{}")
        final = cache.publish_content(root, tmp, None, "c" * 64)
    assert final == root / cache.IMAGES / ("c" * 64)
    assert not (root / cache.RECIPES).exists() or not any((root / cache.RECIPES).iterdir())
