"""Ports for embedded servers come from outside the kernel's ephemeral range: a port there
can be taken by any outgoing connection between the pick and the server's bind."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from aenv.stack import portclaims, process
from aenv.stack.process import (
    StackError,
    _ephemeral_range,
    free_port,
    free_ports_outside,
    pick_port,
)


def test_candidates_lie_below_the_usual_ephemeral_range() -> None:
    r = free_ports_outside((32768, 60999))
    assert r.start >= 1024 and r.stop == 32768


def test_candidates_lie_above_a_range_that_starts_too_low() -> None:
    r = free_ports_outside((1500, 50000))
    assert r.start == 50001 and r.stop == 65536


def test_free_port_is_bindable_outside_the_ephemeral_range_and_never_repeats() -> None:
    lo, hi = _ephemeral_range()
    ports = [free_port() for _ in range(20)]
    assert len(set(ports)) == 20
    for port in ports:
        assert not lo <= port <= hi
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def _two_free_ports() -> range:
    """Two consecutive ports that bind right now (below the ephemeral range)."""
    for port in range(21000, 29000, 7):
        try:
            for p in (port, port + 1):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return range(port, port + 2)
    raise AssertionError("no two free ports")


def test_a_port_another_process_was_given_is_not_given_again(tmp_path: Path) -> None:
    """Another process's picks are simulated by forgetting this one's (`_GIVEN`): only the
    machine-wide claims keep the second pick off the first's port."""
    candidates = _two_free_ports()
    first = pick_port(candidates, tmp_path)
    process._GIVEN.discard(first)
    second = pick_port(candidates, tmp_path)
    assert {first, second} == set(candidates)
    process._GIVEN.difference_update(candidates)
    with pytest.raises(StackError):
        pick_port(candidates, tmp_path)  # both claimed


def test_a_lapsed_claim_gives_the_port_again(tmp_path: Path) -> None:
    port = _two_free_ports().start
    assert not portclaims.claimed(tmp_path, port, now=1000.0)
    assert portclaims.claimed(tmp_path, port, now=1000.0 + portclaims.HOLD_S - 1)
    assert not portclaims.claimed(tmp_path, port, now=1000.0 + portclaims.HOLD_S + 1)


def test_an_unusable_claims_dir_hands_ports_out_unclaimed(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    candidates = _two_free_ports()
    port = pick_port(candidates, blocker / "claims")  # its parent is a file
    assert port in candidates
    process._GIVEN.discard(port)
