"""An image fetched from the fleet's repository under the node's disk budget (images-at-scale
S8), for real (NATS log, SeaweedFS, a registry on loopback, no VM): node a builds and
publishes an import, node b imports the same image and fetches it. With room, b's fetch
reserves the stored bytes first and its ledger counts the entry after (high, never low); on
a node whose budget cannot hold it, the fetch is refused as `unavailable` and leaves no
entry."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from bus import Bus
from tests.contract.snapshot.conftest import s3_endpoint
from tests.integration.bus.test_fleet_imports import FREE, _image, _node, registry, store
from tests.registry import LocalRegistry, push
from workers.node.disk import DiskUsage, scan
from workers.node.disk.budget import DiskBudget, NoRoom
from workers.node.disk.categories import IMAGES, STATE
from workers.node.disk.evictor import CacheEvictor
from workers.node.image import cache
from workers.node.image.supply import ImageSupply
from workers.node.imports import import_image
from workers.node.ports import ImageSource
from workers.snapshot import SnapshotStore

__all__ = ["registry", "s3_endpoint", "store"]  # fixtures
MiB = 1 << 20


def _budgeted(node_root: Path, supply: ImageSupply, nbytes: int) -> DiskBudget:
    state = node_root.parent / "state"
    state.mkdir(exist_ok=True)
    budget = DiskBudget(
        DiskUsage(state, node_root), nbytes, headroom=0, evictor=CacheEvictor(node_root, state)
    )
    for _, shelf in supply._images.values():
        shelf.budget = budget
    supply.budget = budget
    return budget


@pytest.mark.parametrize("room", ["enough", "too-little"])
async def test_a_fetch_reserves_its_bytes_first(
    bus: Bus, store: SnapshotStore, registry: LocalRegistry, tmp_path: Path, room: str
) -> None:
    ref = push(_image(tmp_path / "img", uuid.uuid4().hex), registry, "fleet/budget", "1")
    a, b = (_node(bus, store, tmp_path, n) for n in ("a", "b"))
    built = await import_image("one", ImageSource(ref=ref), None, free_bytes=FREE, supply=a.supply)
    entry_bytes = scan([(IMAGES, built.rootfs.parent)]).total
    budget = _budgeted(b.root, b.supply, 2048 * MiB if room == "enough" else 32 * MiB)
    before = budget.used()
    if room == "too-little":
        with pytest.raises(NoRoom) as refused:
            await import_image("two", ImageSource(ref=ref), None, free_bytes=FREE, supply=b.supply)
        assert refused.value.code == "unavailable"
        assert "node disk budget: need" in str(refused.value)
        assert not (b.root / cache.IMAGES).exists() or not any((b.root / cache.IMAGES).iterdir())
        return
    got = await import_image("two", ImageSource(ref=ref), None, free_bytes=FREE, supply=b.supply)
    assert got.content_digest == built.content_digest
    assert b.sample("aenv_image_fetches_total") == 1
    assert budget.reserved() == 0
    assert budget.used() >= before + entry_bytes * 0.99  # the entry is charged at once
    roots = [(STATE, b.root.parent / "state"), (IMAGES, b.root)]
    assert scan(roots).total <= budget.used()  # the ledger errs high, never low
