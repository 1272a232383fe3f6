"""The image aggregate over the real log: nodes that race for the one build of a recipe
through `execute` (each its own store, as each node is its own process) get one claim
between them, and the losers are told who holds it, then — once published — its digest."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from datetime import UTC, datetime, timedelta

import pytest

from bus import AggregateKind, Bus
from bus.decisions import execute
from bus.store import EventStore, ImageStore
from domain import image as im
from domain.aggregates import IMAGE

T0 = datetime(2026, 1, 1, tzinfo=UTC)
DIGEST = hashlib.sha256(b"the bytes n1 built").hexdigest()


def _node(bus: Bus) -> ImageStore:
    """The image store of another process: nothing it decides on comes from ours."""
    return EventStore(bus.js, bus.publisher, bus.settings, IMAGE)


def _recipe() -> str:
    return im.image_aggregate_id(secrets.token_hex(32))


async def _claim(store: ImageStore, iid: str, node: str) -> str:
    try:
        await execute(store, im.ClaimImageBuild(image_id=iid, node_id=node, at=T0))
    except im.ClaimHeld as held:
        return f"held by {held.holder}"
    return "claimed"


async def test_racing_nodes_get_one_claim_between_them(bus: Bus) -> None:
    iid = _recipe()
    nodes = [f"n{i}" for i in range(4)]
    outcomes = await asyncio.gather(*(_claim(_node(bus), iid, n) for n in nodes))
    winners = [n for n, o in zip(nodes, outcomes, strict=True) if o == "claimed"]
    assert len(winners) == 1, outcomes
    assert sorted(outcomes) == ["claimed", *[f"held by {winners[0]}"] * 3]
    history = await bus.images.read(iid)
    assert [type(r.event) for r in history] == [im.ImageBuildClaimed]
    assert history[0].subject == bus.names.events(AggregateKind.IMAGE, iid)


async def test_a_loser_learns_the_holder_then_the_digest(bus: Bus) -> None:
    iid = _recipe()
    n1, n2 = _node(bus), _node(bus)
    await execute(n1, im.ClaimImageBuild(image_id=iid, node_id="n1", at=T0))
    with pytest.raises(im.ClaimHeld) as held:
        await execute(n2, im.ClaimImageBuild(image_id=iid, node_id="n2", at=T0))
    assert (held.value.holder, held.value.until) == ("n1", T0 + timedelta(seconds=900))
    publish = im.PublishImage(
        image_id=iid, digest=DIGEST, stored_bytes=1 << 20, size=1 << 30, role="root", at=T0
    )
    await execute(n1, publish)
    # n2 still holds the claimed state it read: the refusal is checked against the log
    with pytest.raises(im.AlreadyPublished) as published:
        await execute(n2, im.ClaimImageBuild(image_id=iid, node_id="n2", at=T0))
    assert published.value.digest == DIGEST
    state, _ = await _node(bus).load(iid)
    assert state is not None and state.published is not None and state.claim is None


async def test_a_lease_that_ran_out_goes_to_the_next_node(bus: Bus) -> None:
    iid = _recipe()
    await execute(_node(bus), im.ClaimImageBuild(image_id=iid, node_id="n1", lease_s=5, at=T0))
    later = T0 + timedelta(seconds=5)
    state, _, events = await execute(
        _node(bus), im.ClaimImageBuild(image_id=iid, node_id="n2", at=later)
    )
    assert [type(e) for e in events] == [im.ImageBuildClaimed]
    assert state is not None and state.claim is not None and state.claim.node_id == "n2"
