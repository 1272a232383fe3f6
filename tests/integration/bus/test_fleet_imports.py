"""Registry imports built once per fleet, for real (images-at-scale S5): two nodes, each
with its own image cache, race an import of one never-seen image — under two tags of one
manifest, so two templates — over the real log (NATS), the real repository (SeaweedFS) and
a real registry on loopback. The import's recipe comes from the registry's manifest digest
(`registry.resolve`), so only the claim's winner pulls a layer, unpacks and runs mkfs; the
other fetches its bytes. No VM: the import stops at the guest image."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from aenv.stack import S3Endpoint
from bus import Bus
from bus.store import EventStore
from domain import image as im
from domain.aggregates import IMAGE
from tests.contract.snapshot.conftest import s3_config, s3_endpoint
from tests.registry import (
    LocalRegistry,
    busybox_tree,
    import_registry,
    layout,
    own_image_cache,
    push,
)
from workers.node.image import GuestImage, cache
from workers.node.image.build import oci_recipe
from workers.node.image.registry import parse_reference, resolve
from workers.node.image.supply import Fleet, ImageSupply
from workers.node.imports import import_image
from workers.node.metrics import NodeMetrics
from workers.node.ports import ImageSource
from workers.snapshot import ImageRepository, S3Store, SnapshotStore

__all__ = ["s3_endpoint"]  # the session's SeaweedFS, shared with the snapshot contract

#: the machine's image cache: its resolved kernel is lent to each node's own cache, so no
#: node downloads a kernel package for the test
FREE = 64 << 20  # a small root disk: the test is about who builds, not how big


@pytest.fixture
async def store(s3_endpoint: S3Endpoint) -> AsyncIterator[SnapshotStore]:
    s3 = await S3Store.open(s3_config(s3_endpoint))
    try:
        yield s3
    finally:
        await s3.close()


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[LocalRegistry]:
    yield from import_registry(tmp_path)


@dataclass
class Node:
    name: str
    root: Path
    supply: ImageSupply
    metrics: NodeMetrics

    def sample(self, metric: str, **labels: str) -> float:
        got = self.metrics.scrape.registry.get_sample_value(metric, {"node": self.name, **labels})
        return got or 0.0


def _node(bus: Bus, store: SnapshotStore, tmp_path: Path, name: str) -> Node:
    root = own_image_cache(tmp_path / name / "images")
    metrics = NodeMetrics(name)
    fleet = Fleet(
        EventStore(bus.js, bus.publisher, bus.settings, IMAGE),  # a process of its own
        ImageRepository(store),
        name,
        on_fetched=metrics.image_fetched,
        on_built=metrics.image_built,
        lease_s=60,
    )
    return Node(name, root, ImageSupply(root, fleet=fleet, progress=lambda _: None), metrics)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _image(tmp: Path, mark: str) -> Path:
    """A busybox image with a layer of its own: never seen by any cache or the log."""
    top = tmp / "top"
    (top / "etc").mkdir(parents=True)
    (top / "etc/mark").write_text(mark)
    return layout(tmp / "layout", busybox_tree(tmp / "base"), top)


async def test_racing_imports_of_one_image_build_it_once(
    bus: Bus, store: SnapshotStore, registry: LocalRegistry, tmp_path: Path
) -> None:
    image = _image(tmp_path / "img", uuid.uuid4().hex)
    one = push(image, registry, "fleet/imp", "1")
    two = push(image, registry, "fleet/imp", "2")  # the same manifest under another tag
    a, b = (_node(bus, store, tmp_path, n) for n in ("a", "b"))

    got = await asyncio.gather(
        import_image("imp-one", ImageSource(ref=one), None, free_bytes=FREE, supply=a.supply),
        import_image("imp-two", ImageSource(ref=two), None, free_bytes=FREE, supply=b.supply),
    )

    # one recipe, named before any layer was pulled: the registry's manifest digest
    manifest = resolve(parse_reference(one), progress=lambda _: None).manifest
    recipe = oci_recipe(manifest, a.root, progress=lambda _: None, free_bytes=FREE)
    assert {img.digest for img in got} == {recipe}
    assert got[0].content_digest == got[1].content_digest is not None
    history = await bus.images.read(im.image_aggregate_id(recipe))
    assert [type(r.event).__name__ for r in history] == ["ImageBuildClaimed", "ImagePublished"]

    builds = {n.name: n.sample("aenv_image_fleet_builds_total", image="import") for n in (a, b)}
    assert sorted(builds.values()) == [0.0, 1.0], builds
    builder, fetcher = (a, b) if builds["a"] else (b, a)
    assert fetcher.sample("aenv_image_fetches_total") == 1
    assert builder.sample("aenv_image_fetches_total") == 0
    # the fetcher pulled no layer and unpacked nothing: no layout, no blob, no layer chain
    for made in ("oci", "blobs", "layers"):
        assert not (fetcher.root / made).exists(), made
        assert (builder.root / made).is_dir(), made

    mine, theirs = (GuestImage.load((n.root / "recipes" / recipe).resolve()) for n in (a, b))
    assert _sha256(mine.rootfs) == _sha256(theirs.rootfs)
    assert theirs.manifest["source"] == {"kind": "oci", "manifest": manifest}
    assert theirs.manifest["guest"]["defaults"] == mine.manifest["guest"]["defaults"]
    for node, name in ((a, "tpl-imp-one"), (b, "tpl-imp-two")):  # as `build_from_oci` names
        assert (node.root / "names" / name / cache.MANIFEST).is_file()

    # asked again (a third template of it), either node has it: no log, no repository
    again = await import_image(
        "imp-three", ImageSource(ref=one), None, free_bytes=FREE, supply=fetcher.supply
    )
    assert again.digest == recipe and fetcher.sample("aenv_image_fetches_total") == 1
    assert len(await bus.images.read(im.image_aggregate_id(recipe))) == 2


async def test_a_node_without_a_repository_builds_the_same_recipe(
    registry: LocalRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The no-repository path still builds locally, and names the image by the same
    recipe as the fleet path would (the registry's manifest digest)."""
    ref = push(_image(tmp_path / "img", uuid.uuid4().hex), registry, "solo/imp", "1")
    root = own_image_cache(tmp_path / "solo" / "images")
    supply = ImageSupply(root, progress=lambda _: None)
    assert not supply.fleet_wide
    monkeypatch.setenv(cache.CACHE_ENV, str(root))  # `convert_image` builds in the node's
    img = await import_image("solo", ImageSource(ref=ref), None, free_bytes=FREE, supply=supply)
    manifest = resolve(parse_reference(ref), progress=lambda _: None).manifest
    assert img.digest == oci_recipe(manifest, root, progress=lambda _: None, free_bytes=FREE)
    assert img.manifest["source"]["manifest"] == manifest
    assert (root / "blobs").is_dir() and (root / "names" / "tpl-solo").exists()
