"""Ports for embedded servers come from outside the kernel's ephemeral range: a port there
can be taken by any outgoing connection between the pick and the server's bind."""

from __future__ import annotations

import socket

from aenv.stack.process import _ephemeral_range, free_port, free_ports_outside


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
