"""Disk layer chains with the real qemu-img (no VM needed)."""

from __future__ import annotations

from pathlib import Path

from workers.node.runtime import LayerStore


async def test_chain_and_collect_keep_what_live_tops_need(tmp_path: Path) -> None:
    base = tmp_path / "base.raw"
    with open(base, "wb") as f:
        f.truncate(64 << 20)
    store = LayerStore(tmp_path / "layers")
    l0 = await store.create_top(base, backing_raw=True)
    l1 = await store.create_top(l0)
    l2 = await store.create_top(l1)
    other = await store.create_top(l0)
    assert await store.chain(l2) == [l2, l1, l0, base]
    assert store.lineage(l2) == [l2, l1, l0, base]

    dead = store.collect({l2})
    assert dead == [other]
    assert all(p.exists() for p in (l0, l1, l2)) and not other.exists()
    assert store.collect(set()) and not l0.exists() and base.exists()


async def test_compact_flattens_a_chain_over_the_base(tmp_path: Path) -> None:
    base = tmp_path / "base.raw"
    with open(base, "wb") as f:
        f.truncate(16 << 20)
    store = LayerStore(tmp_path / "layers")
    top = await store.create_top(await store.create_top(base, backing_raw=True))
    flat = await store.compact(top)
    assert await store.chain(flat) == [flat, base]
