"""Readiness: the verdict names every dependency that is down, and a hung probe is down."""

from __future__ import annotations

import asyncio

from api.health import run, verdict


def test_all_up_is_ok() -> None:
    assert verdict({"nats": None, "postgres": None}) == (200, "ok")


def test_what_is_down_is_named() -> None:
    status, message = verdict({"nats": None, "s3": "answers 502", "postgres": "refused"})
    assert status == 503
    assert message == "not ready: postgres: refused; s3: answers 502"


async def test_a_hung_or_failing_probe_counts_as_down() -> None:
    async def hangs() -> str | None:
        await asyncio.sleep(60)
        return None

    async def fails() -> str | None:
        raise ConnectionRefusedError("connect refused")

    async def up() -> str | None:
        return None

    results = await run({"a": hangs, "b": fails, "c": up}, timeout=0.2)
    assert results == {
        "a": "no answer within 0.2s",
        "b": "ConnectionRefusedError: connect refused",
        "c": None,
    }
