"""The console's pure parts: the timeline (durations between a request and its outcome, who
asked), the life bar, the fork tree's layout, and every template rendered from plain data
(a misspelt field fails the render: StrictUndefined) with what users typed escaped."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from api.console.render import duration, render, tone
from api.console.timeline import actor_label, lifeline, steps, summary
from api.console.tree import BOX_H, BOX_W, layout
from projections import HistoryLine

T0 = datetime(2026, 12, 1, 15, 38, 25, tzinfo=UTC)


def _line(
    seq: int, kind: str, ms: int, cause: uuid.UUID, actor: str | None = "k1", **details: object
) -> HistoryLine:
    return HistoryLine(
        seq, seq, T0 + timedelta(milliseconds=ms), kind, actor, cause, cause, dict(details), "sbx1"
    )


def test_an_outcome_carries_how_long_after_its_request_it_came() -> None:
    create, pause = uuid.uuid4(), uuid.uuid4()
    lines = [
        _line(1, "SandboxRequested", 0, create, template_id="base"),
        _line(2, "SandboxCreated", 250, create, actor="node:n1", node_id="n1", warm=True),
        _line(3, "SandboxPauseRequested", 1000, pause),
        _line(4, "SandboxPaused", 1012, pause, remaining_s=290.0),
    ]
    out = steps(lines)
    assert [s.took_s for s in out] == [None, 0.25, None, pytest.approx(0.012)]
    assert [s.kind for s in out] == ["request", "done", "request", "done"]
    assert out[1].actor == "node:n1" and out[0].actor == "key k1"
    assert out[1].summary == "node_id=n1  warm=True"
    assert out[3].causation == str(pause)[:8]
    assert '"type": "SandboxPaused"' in out[3].record


def test_failures_and_refusals_read_as_failed_and_the_platform_as_aenv() -> None:
    c = uuid.uuid4()
    out = steps(
        [
            _line(1, "SandboxFailed", 0, c, actor=None, reason="no room"),
            _line(2, "CommandRejected", 5, uuid.uuid4(), code="conflict"),
        ]
    )
    assert [s.kind for s in out] == ["failed", "failed"]
    assert out[0].actor == actor_label(None) == "aenv"


def test_a_summary_is_one_line_of_what_tells_the_event_apart() -> None:
    children = [{"sandbox_id": f"c{i}", "error": None} for i in range(3)]
    assert summary({"children": children, "command_id": "x"}) == "children=c0,c1,c2"
    assert len(summary({"reason": "x" * 500})) == 160


def test_the_life_bar_holds_each_status_for_as_long_as_it_lasted() -> None:
    points = [
        (T0, "creating"),
        (T0 + timedelta(seconds=0.2), "running"),
        (T0 + timedelta(seconds=10), "running"),  # a TTL set: no change
        (T0 + timedelta(seconds=60), "pausing"),
        (T0 + timedelta(seconds=60.1), "paused"),
    ]
    segs = lifeline(points, T0 + timedelta(seconds=120))
    assert [(s.state, round(s.seconds, 1)) for s in segs] == [
        ("creating", 0.2),
        ("running", 59.8),
        ("pausing", 0.1),
        ("paused", 59.9),
    ]
    assert all(s.share >= 0.01 for s in segs)  # a moment still shows
    assert sum(s.share for s in segs) == pytest.approx(1.0)
    killed = lifeline(
        [(T0, "running"), (T0 + timedelta(seconds=5), "killed")], T0 + timedelta(hours=1)
    )
    assert [(s.state, s.seconds) for s in killed] == [("running", 5.0), ("killed", 0.0)]


def _rows(*links: tuple[str, str | None], status: str = "running") -> list[dict[str, object]]:
    return [{"sandbox_id": s, "forked_from": p, "status": status} for s, p in links]


def test_the_tree_puts_a_parent_over_its_children_and_each_generation_lower() -> None:
    rows = _rows(("root", None), ("a", "root"), ("b", "root"), ("a1", "a"), ("a2", "a"))
    d = layout(rows, "a")
    at = {n.sandbox_id: (n.x, n.y) for n in d.nodes}
    assert at["a1"][1] == at["a2"][1] > at["a"][1] == at["b"][1] > at["root"][1]
    assert at["a"][0] == (at["a1"][0] + at["a2"][0]) // 2  # centred over its children
    assert at["root"][0] == (at["a"][0] + at["b"][0]) // 2
    assert len(d.edges) == 4 and d.has_forks
    assert [n.sandbox_id for n in d.nodes if n.current] == ["a"]
    assert d.width >= 3 * BOX_W and d.height >= 3 * BOX_H
    xs = sorted(x for x, y in at.values() if y == at["a1"][1])
    assert xs[1] - xs[0] >= BOX_W  # leaves never overlap


def test_a_lone_sandbox_has_no_tree_and_a_cycle_never_hangs() -> None:
    assert not layout(_rows(("solo", None)), "solo").has_forks
    looped = layout(_rows(("x", "y"), ("y", "x"), ("z", "gone")), "z")  # z's parent unread
    assert [n.sandbox_id for n in looped.nodes] == ["z"]


def test_durations_and_tones_read_at_a_glance() -> None:
    assert [duration(x) for x in (0.085, 12.34, 245, 3720, 90000, None)] == [
        "85 ms",
        "12.3 s",
        "4 min 05 s",
        "1 h 02 min",
        "1 d 1 h",
        "—",
    ]
    assert [tone(s) for s in ("running", "paused", "forking", "killed", "failed")] == [
        "ok",
        "paused",
        "busy",
        "off",
        "bad",
    ]


def _sandbox(**over: object) -> dict[str, object]:
    row: dict[str, object] = {
        "sandbox_id": "abc123",
        "status": "running",
        "state": "running",
        "template_id": "base",
        "alias": "base",
        "template": "base",
        "node_id": "n1",
        "forked_from": None,
        "cpu_count": 2,
        "memory_mb": 512,
        "disk_size_mb": 2048,
        "envd_version": "0.6.4",
        "metadata": {"run": "<script>alert(1)</script>"},
        "requested_at": T0,
        "started_at": T0,
        "end_at": T0 + timedelta(minutes=5),
        "remaining_s": None,
        "failure_reason": None,
        "timeout_s": 300,
        "on_timeout": "pause",
        "auto_resume": False,
        "allow_internet_access": True,
        "revision": 7,
        "updated_at": T0,
    }
    row.update(over)
    return row


def test_every_fragment_renders_and_escapes_what_users_typed() -> None:
    from api.console.reads import Filters

    now = T0 + timedelta(minutes=1)
    out = render("sandbox.html", s=_sandbox(), now=now)
    assert "&lt;script&gt;" in out and "<script>alert" not in out
    assert 'data-end-at="2026-12-01T15:43:25+00:00"' in out and "4 min 00 s left" in out
    assert 'data-revision="7"' in out
    assert 'id="disk-full"' not in out
    full = render("sandbox.html", s=_sandbox(disk_full_at=T0 + timedelta(seconds=30)), now=now)
    assert 'id="disk-full"' in full and "filled up 30.0 s ago" in full
    paused = render("sandbox.html", s=_sandbox(status="paused", remaining_s=90.0), now=now)
    assert "1 min 30 s left once resumed" in paused
    listing = render(
        "sandbox_list.html",
        rows=[_sandbox(), _sandbox(sandbox_id="d2")],
        total=120,
        f=Filters(page=2),
        pages=3,
        first=51,
        now=now,
    )
    assert "120 sandboxes · 51\u201352 shown" in listing and "page 2 of 3" in listing
    c = uuid.uuid4()
    history = render(
        "history.html",
        s=_sandbox(),
        steps=steps([_line(1, "SandboxRequested", 0, c), _line(2, "SandboxCreated", 30, c)]),
        tree=layout(_rows(("abc123", None), ("kid", "abc123")), "abc123"),
        life=lifeline([(T0, "creating"), (T0, "running")], now),
        box_w=BOX_W,
        box_h=BOX_H,
    )
    assert re.search(r'<svg id="fork-tree"', history)
    assert 'href="/console/sandboxes/kid"' in history and "30 ms" in history
    beat = {
        "node": "n1",
        "state": "beating",
        "last_beat_s": 1.2,
        "accelerator": "tcg",
        "running": 3,
        "paused": 1,
        "uploads_waiting": 0,
        "room": {
            "vcpus": 32,
            "free_vcpus": 29,
            "mem_mib": 9000,
            "free_mem_mib": 7000,
            "sandboxes": 100,
            "free_sandboxes": 96,
        },
        "warm": {"ready": {"base": 2}, "hits": 5, "misses": 1, "mem_mib": 300},
        "disk": {"used": 3 << 30, "budget": 10 << 30, "room": 7 << 30},
    }
    fleet = render(
        "fleet.html",
        now=now,
        fleet={
            "nodes": [beat],
            "beating": 1,
            "gone": 0,
            "running": 3,
            "paused": 1,
            "placement_skew": 1.0,
        },
        counts=[("running", 3), ("killed", 0)],
        total=3,
        templates=1,
        warm=2,
        builds=[],
    )
    assert "29 / 32" in fleet and "base 2" in fleet and "No builds yet." in fleet
    assert re.search(r"3\.0\s*/ 10\.0 GiB", fleet) and "7.0 GiB room" in fleet  # its disk
    build = {
        "build_id": str(uuid.uuid4()),
        "template_id": "t",
        "alias": "t",
        "status": "error",
        "reason": "exit 1",
        "failed_step": "2",
        "log_count": 3,
        "cpu_count": 2,
        "memory_mb": 512,
        "disk_size_mb": 2048,
        "requested_at": T0,
        "started_at": T0,
        "finished_at": now,
        "sandbox_id": None,
    }
    assert "failed at step 2" in render("build.html", b=build, now=now)
    tpl = {
        "template_id": "t",
        "alias": "t",
        "cpu_count": 2,
        "memory_mb": 512,
        "disk_size_mb": 2048,
        "tags": {"v1": {}},
    }
    assert "v1" in render(
        "templates.html", templates=[(tpl, [build]), (None, [build])], builds=[build], now=now
    )
    for page in ("page.html", "sandboxes_page.html"):
        assert "aenv console" in render(page, page="fleet", title="Fleet", fragment="/x", poll=3)
    for page in ("sandbox_page.html", "terminal_page.html"):
        assert "abc123" in render(page, page="sandboxes", title="abc123", sid="abc123")
    assert "b1" in render("build_page.html", page="templates", title="Build", bid="b1")
