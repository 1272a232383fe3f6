"""The roles' event loop choice: uvloop by default, the stdlib loop when asked, and a clear
error for anything else (a typo must not silently pick a loop)."""

from __future__ import annotations

import asyncio

import pytest

from aenv import eventloop


def test_uvloop_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(eventloop.ENV, raising=False)
    assert eventloop.loop_name() == "uvloop"


def test_the_stdlib_loop_can_be_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(eventloop.ENV, "asyncio")
    assert eventloop.loop_name() == "asyncio"


def test_an_unknown_loop_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(eventloop.ENV, "tornado")
    with pytest.raises(SystemExit, match="AENV_EVENT_LOOP"):
        eventloop.loop_name()


@pytest.mark.parametrize("name", ["uvloop", "asyncio"])
def test_run_runs_on_the_chosen_loop(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv(eventloop.ENV, name)

    async def which() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert eventloop.run(which()).startswith("uvloop" if name == "uvloop" else "asyncio")
