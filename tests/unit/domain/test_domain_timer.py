"""The TTL timer's pure decision: what to issue at expiry, with a replica-stable id."""

from __future__ import annotations

import pytest

from domain import sandbox as sb
from tests.unit.domain.builders import SID, STATES, at, paused, running, step


def test_nothing_before_end() -> None:
    assert sb.expiry_command(running(), at(60)) is None  # end_at is 61 s
    assert sb.expiry_command(None, at(1000)) is None


def test_kill_by_default() -> None:
    cmd = sb.expiry_command(running(), at(61))
    assert isinstance(cmd, sb.KillSandbox) and cmd.reason == "timeout" and cmd.at == at(61)


def test_pause_when_lifecycle_says_so() -> None:
    s = running(lifecycle=sb.Lifecycle(on_timeout="pause"))
    cmd = sb.expiry_command(s, at(100))
    assert isinstance(cmd, sb.PauseSandbox) and cmd.reason == "timeout"
    # the pause it issues is accepted, and the paused sandbox then no longer expires
    p = step(step(s, cmd), sb.CompletePause(sandbox_id=SID, at=at(101)))
    assert sb.expiry_command(p, at(10_000)) is None


def test_replicas_build_the_same_command() -> None:
    s = running()
    a, b = sb.expiry_command(s, at(61)), sb.expiry_command(s, at(999))
    assert a is not None and a == b  # same id AND same payload: dedup is exact


def test_extension_gives_a_new_id() -> None:
    s = running()
    first = sb.expiry_command(s, at(61))
    s2 = step(s, sb.SetSandboxTimeout(sandbox_id=SID, at=at(61), timeout_s=10))
    second = sb.expiry_command(s2, at(71))
    assert first is not None and second is not None
    assert first.command_id != second.command_id


@pytest.mark.parametrize("name", sorted(set(STATES) - {"running"}))
def test_only_running_sandboxes_expire(name: str) -> None:
    assert sb.expiry_command(STATES[name](), at(10**6)) is None


def test_paused_time_does_not_count() -> None:
    s = paused()
    assert sb.expiry_command(s, at(10**6)) is None


@pytest.mark.parametrize("keep", [True, False])
def test_timeout_pause_keeps_memory_as_the_create_asked(keep: bool) -> None:
    s = running(lifecycle=sb.Lifecycle(on_timeout="pause", pause_memory=keep))
    cmd = sb.expiry_command(s, at(100))
    assert isinstance(cmd, sb.PauseSandbox) and cmd.keep_memory is keep
    # the clock the timer keeps (seeded from the read model or from events) agrees
    clock = sb.clock_of(s)
    assert clock is not None and clock.pause_memory is keep
    via_clock = sb.expiry_command(clock, at(100))
    assert via_clock == cmd
