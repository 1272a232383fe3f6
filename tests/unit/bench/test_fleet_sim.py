"""The fleet simulator's pure helpers: how it splits the fleet, reads /proc, sums up skew."""

from __future__ import annotations

import pytest

from bench.fleet_sim import CLK_TCK, cores, node_id, skew, split_fleet, stat_comm, stat_cpu_s


def test_split_fleet_spreads_nodes_evenly_and_covers_every_one() -> None:
    parts = split_fleet(200, 3)
    assert [n for _, n in parts] == [67, 67, 66]
    covered = [i for first, n in parts for i in range(first, first + n)]
    assert covered == list(range(200))


def test_split_fleet_never_makes_empty_processes() -> None:
    assert split_fleet(2, 4) == [(0, 1), (1, 1)]
    assert split_fleet(5, 0) == [(0, 5)]


def test_simulated_node_ids_say_so_and_fit_a_node_id() -> None:
    assert node_id(7) == "sim-0007"
    assert node_id(999) == "sim-0999"


def test_stat_line_cpu_with_a_command_name_holding_spaces_and_parens() -> None:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
    # utime stime cutime cstime ...
    line = "42 (postgres: a (b) c) S 1 42 42 0 -1 0 0 0 0 0 300 200 50 25 20 0 1 0"
    assert stat_comm(line) == "postgres: a (b) c"
    assert stat_cpu_s(line) == pytest.approx(500 / CLK_TCK)
    assert stat_cpu_s(line, children=True) == pytest.approx(575 / CLK_TCK)


def test_skew_counts_nodes_that_took_nothing() -> None:
    s = skew({"sim-0000": 6, "sim-0001": 2}, nodes=4)
    assert s["nodes_used"] == 2
    assert s["min"] == 0 and s["max"] == 6
    assert s["mean"] == 2.0
    assert s["max_over_mean"] == 3.0


def test_skew_of_nothing_placed() -> None:
    assert skew({}, nodes=3) == {"nodes": 3, "sandboxes": 0}


def test_cores_is_cpu_seconds_over_wall_time() -> None:
    assert cores({"nats": 1.0, "apis": 2.0}, {"nats": 4.0, "apis": 2.5}, 2.0) == {
        "nats": 1.5,
        "apis": 0.25,
    }
