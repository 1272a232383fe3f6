"""The console terminal's envd client (`api/console/pty.py`) against a real envd process:
a login shell on a PTY, keystrokes in, output out, a resize, its end and exit code, the
access token enforced, and a shell killed by `close()` (a browser tab that went away)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from api.console.pty import GuestPty, PtyError
from shared.proxy import Upstream
from tests.integration.envd.conftest import Envd

pytestmark = pytest.mark.timeout(60)


def _upstream(envd: Envd) -> Upstream:
    # the headers a node proxy would need: envd ignores them, the client must pass them on
    return Upstream("127.0.0.1", envd.port, ((b"e2b-sandbox-id", b"envdtest"),))


async def _until(out: AsyncIterator[bytes | int], needle: bytes, seen: bytearray) -> None:
    async with asyncio.timeout(20):
        async for chunk in out:
            assert isinstance(chunk, bytes), f"the shell ended ({chunk}) before {needle!r}"
            seen += chunk
            if needle in seen:
                return
    raise AssertionError(f"{needle!r} never came; got {bytes(seen)!r}")


async def test_a_shell_echoes_resizes_and_exits(envd: Envd) -> None:
    pty = GuestPty(_upstream(envd), envd.token)
    try:
        pid = await pty.open(100, 30)
        assert pid > 0
        out, seen = pty.output(), bytearray()
        await pty.send(b"tty -s && echo IS-A-TTY; stty size\n")
        await _until(out, b"30 100", seen)
        assert b"IS-A-TTY" in seen
        await pty.resize(132, 50)
        await pty.send(b"stty size\n")
        await _until(out, b"50 132", seen)
        await pty.send(b"exit 3\n")
        async with asyncio.timeout(20):
            ends = [c async for c in out if isinstance(c, int)]
        assert ends == [3]
    finally:
        await pty.close()


async def test_a_wrong_token_is_refused(envd: Envd) -> None:
    pty = GuestPty(_upstream(envd), "not-the-token")
    with pytest.raises(PtyError, match=r"401|unauthenticated|access token"):
        await pty.open(80, 24)
    await pty.close()


async def test_close_ends_the_shell(envd: Envd) -> None:
    pty = GuestPty(_upstream(envd), envd.token)
    pid = await pty.open(80, 24)
    await pty.close()
    probe = GuestPty(_upstream(envd), envd.token)
    probe.pid = pid
    try:
        async with asyncio.timeout(10):
            while True:  # the kill lands at once; the process table drops it on reaping
                try:
                    await probe.send(b"echo still-here\n")
                except PtyError:
                    break
                await asyncio.sleep(0.1)
    finally:
        await probe.close()
