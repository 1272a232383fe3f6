"""`FleetImages` over the real log: nodes racing for one recipe build it once and all run
those bytes; a failed build passes to a waiter; a holder that died delays the others by its
lease only. The shelves are in memory (the port's simplest implementation); the log is not."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import pytest

from bus import Bus
from bus.decisions import execute
from bus.store import EventStore
from domain import image as im
from domain.aggregates import IMAGE
from workers.node.image.fleet import BuiltImage, FleetImages


class Shelf:
    """A node's images by recipe, and what it downloaded."""

    def __init__(self) -> None:
        self.images: dict[str, str] = {}
        self.fetched: list[str] = []

    def held(self, recipe: str) -> str | None:
        return self.images.get(recipe)

    async def fetch(self, recipe: str, digest: str) -> None:
        self.fetched.append(digest)
        self.images[recipe] = digest


class Builder:
    """Builds that take a while, each giving other bytes (as real builds do)."""

    def __init__(self, *, fail_first: bool = False, seconds: float = 0.3) -> None:
        self.calls = 0
        self.fail_first = fail_first
        self.seconds = seconds

    def for_node(self, shelf: Shelf, recipe: str) -> Callable[[], Awaitable[BuiltImage]]:
        async def build() -> BuiltImage:
            self.calls += 1
            await asyncio.sleep(self.seconds)
            if self.fail_first and self.calls == 1:
                raise OSError("no space left on device")
            digest = hashlib.sha256(f"build {self.calls}".encode()).hexdigest()
            shelf.images[recipe] = digest
            return BuiltImage(digest=digest, stored_bytes=4096, size=1 << 30)

        return build


def _node(bus: Bus, name: str, shelf: Shelf, lease_s: int = 30) -> FleetImages:
    store = EventStore(bus.js, bus.publisher, bus.settings, IMAGE)  # a process of its own
    return FleetImages(store, shelf, name, lease_s=lease_s)


async def _history(bus: Bus, recipe: str) -> list[str]:
    return [type(r.event).__name__ for r in await bus.images.read(im.image_aggregate_id(recipe))]


async def test_racing_nodes_build_once_and_run_the_same_bytes(bus: Bus) -> None:
    recipe, builder = secrets.token_hex(32), Builder()
    shelves = [Shelf() for _ in range(3)]
    nodes = [_node(bus, f"n{i}", s) for i, s in enumerate(shelves)]
    digests = await asyncio.gather(
        *(
            n.ensure(recipe, "root", builder.for_node(s, recipe))
            for n, s in zip(nodes, shelves, strict=True)
        )
    )
    assert builder.calls == 1
    assert len(set(digests)) == 1
    assert sorted(len(s.fetched) for s in shelves) == [0, 1, 1]
    assert await _history(bus, recipe) == ["ImageBuildClaimed", "ImagePublished"]
    again = await nodes[0].ensure(recipe, "root", builder.for_node(shelves[0], recipe))
    assert again == digests[0] and builder.calls == 1


async def test_a_failed_build_passes_to_a_waiting_node(bus: Bus) -> None:
    recipe, builder = secrets.token_hex(32), Builder(fail_first=True)
    a, b = Shelf(), Shelf()
    first = asyncio.create_task(
        _node(bus, "a", a).ensure(recipe, "root", builder.for_node(a, recipe))
    )
    await asyncio.sleep(0.1)  # a holds the claim
    second = await _node(bus, "b", b).ensure(recipe, "root", builder.for_node(b, recipe))
    with pytest.raises(OSError, match="no space"):
        await first
    assert builder.calls == 2 and b.fetched == [] and b.images[recipe] == second
    assert await _history(bus, recipe) == [
        "ImageBuildClaimed",
        "ImageBuildFailed",
        "ImageBuildClaimed",
        "ImagePublished",
    ]


async def test_a_dead_holder_delays_the_others_by_its_lease_only(bus: Bus) -> None:
    recipe, builder = secrets.token_hex(32), Builder(seconds=0)
    iid = im.image_aggregate_id(recipe)
    dead = im.ClaimImageBuild(image_id=iid, node_id="gone", lease_s=2, at=datetime.now(UTC))
    await execute(bus.images, dead)
    shelf = Shelf()
    loop = asyncio.get_running_loop()
    started = loop.time()
    digest = await _node(bus, "b", shelf).ensure(recipe, "runtime", builder.for_node(shelf, recipe))
    assert 1.0 < loop.time() - started < 10
    state, _ = await bus.images.load(iid)
    assert state is not None and state.published is not None
    assert (state.published.digest, state.published.role) == (digest, "runtime")


async def test_an_image_the_node_holds_needs_no_log(bus: Bus) -> None:
    recipe, shelf = secrets.token_hex(32), Shelf()
    shelf.images[recipe] = "d" * 64
    assert (
        await _node(bus, "a", shelf).ensure(recipe, "root", Builder().for_node(shelf, recipe))
        == "d" * 64
    )
    assert await _history(bus, recipe) == []


async def test_a_held_copy_the_fleet_lacks_is_published_for_the_next_node(bus: Bus) -> None:
    """A node that built its image before the fleet shared images (or with no repository)
    publishes the copy it holds, so the next node fetches it instead of building; a copy
    the fleet has already published is not published again."""
    recipe, builder = secrets.token_hex(32), Builder()
    old, new = Shelf(), Shelf()
    old.images[recipe] = "a" * 64
    shared: list[str] = []

    async def share() -> BuiltImage:
        shared.append(recipe)
        return BuiltImage(digest="a" * 64, stored_bytes=4096, size=1 << 30)

    first = _node(bus, "old", old)
    assert (
        await first.ensure(recipe, "root", builder.for_node(old, recipe), share=share) == "a" * 64
    )
    await asyncio.gather(*first._sharing)
    assert shared == [recipe]
    assert await _history(bus, recipe) == ["ImageBuildClaimed", "ImagePublished"]
    second = _node(bus, "new", new)
    assert await second.ensure(recipe, "root", builder.for_node(new, recipe)) == "a" * 64
    assert builder.calls == 0 and new.fetched == ["a" * 64]
    await first.ensure(recipe, "root", builder.for_node(old, recipe), share=share)
    await asyncio.gather(*first._sharing)
    assert shared == [recipe]  # published already: nothing to share
