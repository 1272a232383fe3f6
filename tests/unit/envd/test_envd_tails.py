"""The output tail a process keeps and the table of ended processes (pure)."""

from __future__ import annotations

import base64
import json

import pytest

from envd.__main__ import parse_args
from envd.guest_init import ended_keep
from envd.procs import replay
from envd.tails import ENDED_KEEP, ENDED_KEEP_S, Ended, EndedTable, OutputTail

OUT = b'{"event":{"data":{"stdout":"'
ERR = b'{"event":{"data":{"stderr":"'


def test_a_tail_keeps_the_last_bytes_of_each_stream_in_read_order() -> None:
    t = OutputTail(limit=16)
    assert t.add(OUT, b"hello ") == 0
    assert t.add(ERR, b"oops\n") == 1
    assert t.add(OUT, b"world\n") == 2
    assert t.since() == [(0, OUT, b"hello "), (1, ERR, b"oops\n"), (2, OUT, b"world\n")]
    # stdout is over its 16 bytes: its oldest bytes go, stderr's stay
    t.add(OUT, b"bye!!\n")
    assert t.size(OUT) == 16 and t.size(ERR) == 5
    assert t.since() == [(0, OUT, b"llo "), (1, ERR, b"oops\n"), (2, OUT, b"world\nbye!!\n")]
    # from a chunk number on: what was read since then (consecutive chunks joined)
    assert t.since(2) == [(2, OUT, b"world\nbye!!\n")]
    assert t.since(3) == [(3, OUT, b"bye!!\n")]
    assert t.since(4) == []
    assert t.count == 4


def test_a_chunk_larger_than_the_tail_keeps_its_end() -> None:
    t = OutputTail(limit=4)
    t.add(OUT, b"abc")
    t.add(OUT, b"0123456789")
    assert t.since() == [(1, OUT, b"6789")] and t.size(OUT) == 4


def test_many_small_chunks_stay_bounded() -> None:
    t = OutputTail(limit=1000)
    for i in range(100_000):
        t.add(OUT if i % 3 else ERR, b"%d\n" % i)
    assert t.size(OUT) == 1000 and t.size(ERR) == 1000
    out = b"".join(d for _, s, d in t.since() if s == OUT)
    assert out.endswith(b"99997\n99998\n") and len(out) == 1000


def test_a_zero_limit_keeps_nothing_but_still_numbers_chunks() -> None:
    t = OutputTail(limit=0)
    assert t.add(OUT, b"x") == 0 and t.add(OUT, b"y") == 1
    assert t.since() == []


def test_replay_makes_data_events() -> None:
    t = OutputTail()
    t.add(OUT, b"a\n")
    t.add(ERR, b"b\n")
    assert [seq for seq, _ in replay(t)] == [0, 1]
    events = [json.loads(p) for _, p in replay(t)]
    assert events == [
        {"event": {"data": {"stdout": base64.b64encode(b"a\n").decode()}}},
        {"event": {"data": {"stderr": base64.b64encode(b"b\n").decode()}}},
    ]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _ended(pid: int, at: float, tag: str | None = None) -> Ended:
    return Ended(pid, tag, {}, OutputTail(), b"{}", at)


def test_ended_records_expire_after_their_time() -> None:
    clock = Clock()
    table = EndedTable(keep=10, keep_s=60, clock=clock)
    table.add(_ended(1, clock()))
    clock.t += 30
    table.add(_ended(2, clock()))
    assert table.find(pid=1) is not None and len(table) == 2
    clock.t += 30  # pid 1 is 60 s old
    assert table.find(pid=1) is None
    assert table.find(pid=2) is not None
    clock.t += 30
    assert len(table) == 0 and table.find(pid=2) is None


def test_only_the_most_recent_ended_are_kept() -> None:
    clock = Clock()
    table = EndedTable(keep=3, keep_s=60, clock=clock)
    for pid in range(1, 6):
        table.add(_ended(pid, clock()))
    assert [r.pid for r in table] == [3, 4, 5]


def test_by_tag_the_latest_answers_and_a_new_process_takes_over_a_pid() -> None:
    clock = Clock()
    table = EndedTable(keep=10, keep_s=60, clock=clock)
    table.add(_ended(1, clock(), tag="job"))
    table.add(_ended(2, clock(), tag="job"))
    found = table.find(tag="job")
    assert found is not None and found.pid == 2
    assert table.find(tag="other") is None and table.find() is None
    table.forget(2)  # pid 2 runs again: its old record no longer answers
    found = table.find(tag="job")
    assert found is not None and found.pid == 1
    # the same pid ending again replaces its record and counts as the newest
    table.add(_ended(1, clock() + 1))
    assert [r.pid for r in table] == [1]


def test_a_zero_keep_keeps_nothing() -> None:
    clock = Clock()
    for table in (EndedTable(keep=0, clock=clock), EndedTable(keep_s=0, clock=clock)):
        table.add(_ended(1, clock()))
        assert table.find(pid=1) is None


def test_the_keep_settings_are_envd_flags() -> None:
    o = parse_args([])
    assert (o.ended_keep, o.ended_keep_s) == (ENDED_KEEP, ENDED_KEEP_S)
    o = parse_args(["--ended-keep", "5", "--ended-keep-s=1.5"])
    assert (o.ended_keep, o.ended_keep_s) == (5, 1.5)
    for bad in (["--ended-keep", "-1"], ["--ended-keep-s", "x"], ["--ended-keep-s", "nan"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_new_bounds_apply_to_what_is_kept() -> None:
    clock = Clock()
    table = EndedTable(keep=10, keep_s=600, clock=clock)
    for pid in range(1, 6):
        table.add(_ended(pid, clock()))
        clock.t += 10
    table.set_bounds(keep=3)
    assert [r.pid for r in table] == [3, 4, 5]
    table.set_bounds(keep_s=25)  # pid 3 ended 30 s ago, 4 20 s ago
    assert [r.pid for r in table] == [4, 5]
    table.set_bounds()
    assert (table.keep, table.keep_s) == (3, 25)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({}, (None, None)),
        ({"aenvEndedKeep": 0, "aenvEndedKeepS": 600}, (0, 600.0)),
        ({"aenvEndedKeepS": 1.5}, (None, 1.5)),
    ],
)
def test_init_may_set_the_bounds(body: dict[str, object], expected: object) -> None:
    assert ended_keep(body) == expected


@pytest.mark.parametrize(
    "body",
    [
        {"aenvEndedKeep": -1},
        {"aenvEndedKeep": True},
        {"aenvEndedKeep": 1.5},
        {"aenvEndedKeepS": "600"},
        {"aenvEndedKeepS": -0.1},
        {"aenvEndedKeepS": float("nan")},
    ],
)
def test_init_refuses_bad_bounds(body: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="aenvEndedKeep"):
        ended_keep(body)
