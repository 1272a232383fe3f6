"""The eviction plan (images-at-scale S8): regenerable caches first in their fixed order,
then durable entries least recently used first; never what runs or is the only copy."""

from __future__ import annotations

import pytest

from workers.node.disk.categories import CATEGORIES, Category
from workers.node.disk.evict import DURABLE, REGENERABLE, Entry, plan


def e(key: str, category: Category, size: int = 10, used: float = 0.0, **kw: object) -> Entry:
    return Entry(key, category, size, used, **kw)  # type: ignore[arg-type]


def test_regenerable_first_in_order_then_durable_by_age() -> None:
    entries = [
        e("img-old", "image", used=1),
        e("cap-up", "capture", used=2, uploaded=True),
        e("rt", "runtime", used=3),
        e("blobcache", "blob_cache", used=0),
        e("rootfs", "rootfs_tree", used=9),
        e("blob", "oci_blob", used=5),
        e("pool", "ram_pool", used=7),
        e("chain-new", "chain", used=8),
        e("chain-old", "chain", used=4),
    ]
    p = plan(entries, need=10**9)
    assert not p.enough and p.evict == () and p.freed == 0
    assert p.evictable == 90
    p = plan(entries, need=90)
    assert [x.key for x in p.evict] == [
        "chain-old",
        "chain-new",
        "pool",
        "blob",
        "rootfs",
        "blobcache",
        "img-old",
        "cap-up",
        "rt",
    ]


def test_shortest_prefix_that_frees_the_need() -> None:
    entries = [e("a", "chain", 100, 1), e("b", "chain", 100, 2), e("c", "image", 100, 0)]
    p = plan(entries, need=150)
    assert [x.key for x in p.evict] == ["a", "b"] and p.freed == 200 and p.enough
    assert plan(entries, need=0).evict == ()


@pytest.mark.parametrize("category", ["vm", "layer", "scratch", "volume", "kernel", "other"])
def test_never_evicted(category: Category) -> None:
    p = plan([e("x", category, 100)], need=1)
    assert not p.enough and p.evictable == 0


def test_capture_only_if_uploaded() -> None:
    only_copy = e("cap", "capture", 100, uploaded=False)
    assert plan([only_copy], need=1).evictable == 0
    assert plan([e("cap", "capture", 100, uploaded=True)], need=1).enough


def test_pins_are_skipped() -> None:
    entries = [e("old", "image", 100, 1), e("new", "image", 100, 2)]
    p = plan(entries, need=100, pins={"old"})
    assert [x.key for x in p.evict] == ["new"]
    p = plan(entries, need=150, pins={"old"})
    assert not p.enough and p.evictable == 100


def test_an_image_under_a_capture_goes_after_it_or_never() -> None:
    base = e("base", "image", 100, used=0)  # older than its capture
    cap = e("cap", "capture", 50, used=5, uploaded=True, holds=("base",))
    p = plan([base, cap], need=120)
    assert [x.key for x in p.evict] == ["cap", "base"]
    # the capture is the only copy: its base stays too
    stuck = e("cap", "capture", 50, used=5, uploaded=False, holds=("base",))
    p = plan([base, stuck], need=1)
    assert not p.enough and p.evictable == 0
    # a pinned capture keeps its base
    p = plan([base, cap], need=1, pins={"cap"})
    assert not p.enough and p.evictable == 0


def test_every_category_has_a_rule() -> None:
    assert set(REGENERABLE) | set(DURABLE) <= set(CATEGORIES)
    assert not set(REGENERABLE) & set(DURABLE)
