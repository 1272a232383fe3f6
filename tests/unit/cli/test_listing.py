"""What `aenv ls`, `info` and `timeout` show of a sandbox's time: a running one's is its end,
a paused one's what it kept — never a paused sandbox shown as long expired (issue 18)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from aenv.commands.listing import details, human, left_s, row

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _wire(**extra: object) -> dict[str, object]:
    return {
        "sandboxID": "s1",
        "templateID": "base",
        "alias": "base",
        "state": "running",
        "startedAt": "2026-01-01T11:00:00Z",
        "endAt": "2026-01-01T12:05:00Z",
        "cpuCount": 1,
        "memoryMB": 512,
        "metadata": {"k": "v"},
        **extra,
    }


def test_a_running_sandbox_has_until_its_end() -> None:
    r = row(_wire())
    assert left_s(r, NOW) == 300 and human(r, NOW)["expires_in"] == "5m00s"
    assert human(r, NOW)["age"] == "1h00m"


def test_a_paused_sandbox_has_what_it_kept_however_long_ago_it_ended() -> None:
    r = row(
        _wire(
            state="paused",
            endAt="2026-01-01T11:40:00Z",
            pausedAt="2026-01-01T11:39:00Z",
            remainingS=298,
        )
    )
    assert left_s(r, NOW) == 298 and left_s(r, NOW + timedelta(hours=5)) == 298
    assert human(r, NOW)["expires_in"] == "4m58s (paused)"
    assert r["paused_at"] == "2026-01-01T11:39:00+00:00"


def test_info_carries_the_detail_but_never_a_token() -> None:
    d = details(
        _wire(
            diskSizeMB=2048,
            nodeID="n1",
            envdAccessToken="secret",
            trafficAccessToken="secret",
            lifecycle={"onTimeout": "pause"},
        )
    )
    assert (d["disk_mb"], d["node_id"], d["lifecycle"]) == (2048, "n1", {"onTimeout": "pause"})
    assert "secret" not in repr(d)
