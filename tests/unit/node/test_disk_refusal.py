"""A node asked to create what its disk cannot hold refuses it like a create its memory
cannot hold (`openings.py::_room_to_create`): a short nak another node may take, and
nothing of its room kept."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from bus import RetryableError
from domain import sandbox as sb
from workers.node.capacity import Ledger, Size
from workers.node.memory import MemoryHost
from workers.node.openings import Openings

GIB = 1 << 30


def _openings(room: int | None) -> tuple[Openings, Ledger]:
    ledger = Ledger(vcpus=4, mem_mib=4096, max_sandboxes=4)
    site: Any = SimpleNamespace(
        host=MemoryHost(capacity=4, templates=("base",)), capacity=ledger, node_id="n1", bus=None
    )
    openings = Openings(
        site,
        Size(1, 512),
        on_moot=lambda _: None,
        kill=lambda *_: None,  # type: ignore[arg-type,return-value]
        disk_room=lambda: room,
        disk_headroom=GIB,
    )
    return openings, ledger


def _create(sid: str, template: str, fetched: int) -> sb.CreateSandbox:
    return sb.CreateSandbox(sandbox_id=sid, template_id=template, template_bytes=fetched)


def test_a_template_it_would_fetch_past_its_room_is_refused_and_nothing_held() -> None:
    openings, ledger = _openings(room=3 * GIB)
    with pytest.raises(RetryableError) as refused:
        openings.creating.take(_create("s1", "big", 4 * GIB))
    assert refused.value.final_code == "unavailable" and refused.value.delay_s == 0.25
    assert str(refused.value) == (
        f"node n1 has no disk room for template big: needs {5 * GIB} bytes, has {3 * GIB}"
    )
    assert ledger.room().free_sandboxes == 4  # the refusal kept none of its room


def test_what_fits_or_is_held_here_is_taken() -> None:
    openings, ledger = _openings(room=3 * GIB)
    openings.creating.take(_create("s1", "small", 2 * GIB))  # 2 GiB + 1 GiB headroom
    openings.creating.take(_create("s2", "base", 100 * GIB))  # held: the headroom only
    assert ledger.room().free_sandboxes == 2


def test_a_node_that_does_not_know_its_room_takes_anything() -> None:
    openings, _ = _openings(room=None)
    openings.creating.take(_create("s1", "big", 1 << 50))


async def test_a_template_whose_fetch_its_disk_refuses_goes_to_another_node() -> None:
    # the node's room said yes (its template_bytes unknown); the fetch itself said no
    openings, _ = _openings(room=None)
    openings.site.host.no_room_for = frozenset({"big"})
    with pytest.raises(RetryableError) as refused:
        await openings.creating.ready(_create("s1", "big", 0))
    assert refused.value.final_code == "unavailable" and refused.value.delay_s == 0
    message = str(refused.value)
    assert message.startswith("node n1 cannot take template big: "), message
    assert "node disk budget: need 2048 MiB" in message, message


async def test_a_template_whose_bytes_are_nowhere_goes_to_another_node() -> None:
    openings, _ = _openings(room=None)
    with pytest.raises(RetryableError) as refused:
        await openings.creating.ready(_create("s1", "gone", 0))
    assert refused.value.final_code == "unavailable"
    assert "template 'gone' is not on this node" in str(refused.value)
    await openings.creating.ready(_create("s2", "base", 0))  # held: nothing to fetch


async def test_a_fetch_refused_under_the_claim_fails_the_create_as_unavailable() -> None:
    openings, _ = _openings(room=None)
    openings.site.journal = SimpleNamespace(add=lambda *_: None, remove=lambda *_: None)
    guest: Any = SimpleNamespace()
    error, started = await openings._start("s1", "gone", guest)
    assert error is not None and not started
    done = openings.creating.complete(_create("s1", "gone", 0), error, None)
    assert isinstance(done, sb.CompleteCreate) and done.code == "unavailable"
    # another failure keeps no code (the node's own: 500)
    other = openings.creating.complete(_create("s2", "base", 0), "boom", None)
    assert isinstance(other, sb.CompleteCreate) and other.code is None
