"""Small helpers shared by every test tier: polling instead of sleeping; names of our own."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def session_tag() -> str:
    """`AENV_TEST_TAG` (a few letters, default none): ends the slot prefixes (netns
    `<prefix>-<i>`) of this test session. Two sessions on one machine — CI beside a
    developer's run — must not share prefixes: a node sweeps its prefix's namespaces at
    start and a teardown asserts none is left, so one session's stack broke the other's."""
    tag = os.environ.get("AENV_TEST_TAG", "")
    if tag and not (tag.isascii() and tag.isalpha() and tag.islower()):
        raise ValueError(f"AENV_TEST_TAG={tag!r}: a-z only")
    return tag


def tagged(prefix: str) -> str:
    """`prefix` as this test session's slot prefix (see `session_tag`)."""
    name = prefix + session_tag()
    if len(name) > 8:
        raise ValueError(f"slot prefix {name!r} is longer than 8 letters: shorten AENV_TEST_TAG")
    return name


async def eventually(
    probe: Callable[[], Awaitable[T]], *, timeout: float = 10.0, interval: float = 0.05
) -> T:
    """Await `probe` until it returns a truthy value or stops raising, or fail after `timeout`.

    Tests poll real systems (a VM booting, a projection catching up); a fixed sleep is
    either flaky or slow, this is neither.
    """
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = await probe()
            if value:
                return value
            last = None
        except Exception as e:  # the probe's failure is the information we report
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last error: {last!r})")
        await asyncio.sleep(interval)


def eventually_sync(probe: Callable[[], T], *, timeout: float = 10.0, interval: float = 0.05) -> T:
    """Synchronous twin of `eventually` for tests that drive blocking clients (the e2b SDK)."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = probe()
            if value:
                return value
            last = None
        except Exception as e:
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last error: {last!r})")
        time.sleep(interval)


def drop_image(digest: str, name: str | None = None) -> None:
    """Remove a test's image from the shared cache: its entry (by content), the recipe's
    link to it and the name it was built under."""
    import shutil

    from workers.node.image.cache import RECIPES, cache_root, entry_dir

    root = cache_root()
    entry = entry_dir(root, digest)
    if entry is not None:
        shutil.rmtree(entry, ignore_errors=True)
    (root / RECIPES / digest).unlink(missing_ok=True)
    if name is not None:
        (root / "names" / name).unlink(missing_ok=True)
