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
