"""Failpoints (`bus.failpoints`): inert without `AENV_FAILPOINTS_FILE`; armed, disarmed and
re-armed by writing the file while the process runs; its file looked at at most once per
check period."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from bus import failpoints
from bus.failpoints import Armed, FailpointError, Failpoints, failpoint, parse


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    failpoints.reset()
    yield
    failpoints.reset()


def test_parse_names_counts_and_comments() -> None:
    text = "# tests only\nheartbeat.beat\n consumer.fetch = 3  # three times\nbad=x\n\n"
    assert parse(text) == {"heartbeat.beat": Armed(), "consumer.fetch": Armed(3)}


def test_parse_the_kill_action() -> None:
    text = "resume.after_cont=kill\nupload.before_put = kill # a crash mid-upload\nx=kil\n"
    assert parse(text) == {
        "resume.after_cont": Armed(1, kill=True),
        "upload.before_put": Armed(1, kill=True),
    }


def test_a_kill_point_kills_its_own_process_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "fp"
    path.write_text("resume.after_cont=kill\n")
    monkeypatch.setenv(failpoints.ENV, str(path))
    kills: list[tuple[int, int]] = []
    monkeypatch.setattr(failpoints.os, "kill", lambda pid, sig: kills.append((pid, sig)))
    failpoint("resume.before_cont")  # another point: nothing
    assert kills == []
    with pytest.raises(FailpointError):  # (only because the kill was faked)
        failpoint("resume.after_cont")
    assert kills == [(os.getpid(), signal.SIGKILL)]
    failpoint("resume.after_cont")  # fired once
    assert len(kills) == 1


def test_inert_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(failpoints.ENV, raising=False)
    failpoint("heartbeat.beat")  # nothing armed, nothing read


def test_armed_in_a_running_process_by_writing_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "fp"
    monkeypatch.setenv(failpoints.ENV, str(path))
    monkeypatch.setattr(failpoints, "CHECK_EVERY_S", 0.0)
    failpoint("heartbeat.beat")  # no file yet: inert
    path.write_text("heartbeat.beat=2\n")
    for _ in range(2):
        with pytest.raises(FailpointError, match=r"heartbeat\.beat"):
            failpoint("heartbeat.beat")
    failpoint("heartbeat.beat")  # its two shots are spent
    failpoint("consumer.fetch")  # another name: never armed
    path.write_text("heartbeat.beat\n")  # changed: read again
    for _ in range(3):
        with pytest.raises(FailpointError):
            failpoint("heartbeat.beat")
    path.unlink()
    failpoint("heartbeat.beat")  # disarmed


def test_the_file_is_looked_at_once_per_period(tmp_path: Path) -> None:
    path = tmp_path / "fp"
    points = Failpoints(path, check_every_s=1.0)
    assert not points.fire("x", now=10.0)
    path.write_text("x\n")
    assert not points.fire("x", now=10.5)  # within the period: not looked at
    assert points.fire("x", now=11.0)
    path.write_text("y\n")
    os.utime(path, ns=(1, 1))  # a change of mtime alone is a change
    assert points.fire("x", now=11.5)
    assert not points.fire("x", now=12.1)
