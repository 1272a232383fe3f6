"""Paused sandboxes are kept `AENV_PAUSED_RETENTION_S`, then killed — a kill with reason
`retention` in the log, its node removing the capture — so the sandboxes a client forgot
(aenv pauses on timeout by default) do not stay for ever."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from bus import Bus
from domain import sandbox as sb
from tests.support import eventually_sync
from tests.vmless.conftest import VmlessStack, vmless_stack


@pytest.fixture(scope="module")
def short(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VmlessStack]:
    with vmless_stack(
        tmp_path_factory.mktemp("aenv-retention"), AENV_PAUSED_RETENTION_S="3"
    ) as stack:
        yield stack


def _kills(stack: VmlessStack, sid: str) -> list[str]:
    async def read() -> list[str]:
        bus = await Bus.connect(stack.bus_settings, setup=False)
        try:
            return [
                r.event.reason
                for r in await bus.sandboxes.read(sid)
                if isinstance(r.event, sb.SandboxKillRequested)
            ]
        finally:
            await bus.close()

    return asyncio.run(read())


def test_a_paused_sandbox_is_killed_once_its_retention_is_over(short: VmlessStack) -> None:
    with httpx.Client(
        base_url=short.api_url, headers={"X-API-KEY": short.api_key}, timeout=30
    ) as c:
        kept = c.post("/v2/sandboxes", json={"templateID": "base", "timeout": 120}).json()
        resumed = c.post("/v2/sandboxes", json={"templateID": "base", "timeout": 120}).json()
        for s in (kept, resumed):
            assert c.post(f"/sandboxes/{s['sandboxID']}/pause").status_code == 204
        # resumed within its retention: stays
        assert (
            c.post(f"/sandboxes/{resumed['sandboxID']}/connect", json={"timeout": 120}).status_code
            == 201
        )
        eventually_sync(
            lambda: c.get(f"/sandboxes/{kept['sandboxID']}").status_code == 404,
            timeout=30,
            interval=0.5,
        )
        assert _kills(short, kept["sandboxID"]) == ["retention"]
        assert c.get(f"/sandboxes/{resumed['sandboxID']}").json()["state"] == "running"
        assert _kills(short, resumed["sandboxID"]) == []
        c.delete(f"/sandboxes/{resumed['sandboxID']}")


@pytest.fixture(scope="module")
def e2b_like(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VmlessStack]:
    with vmless_stack(
        tmp_path_factory.mktemp("aenv-kill-on-timeout"), AENV_DEFAULT_ON_TIMEOUT="kill"
    ) as stack:
        yield stack


def test_e2bs_kill_on_timeout_is_one_setting_away(e2b_like: VmlessStack) -> None:
    """`AENV_DEFAULT_ON_TIMEOUT=kill` (docs: E2B's behaviour): a sandbox created with no
    `lifecycle` (no `autoPause`) — as E2B's CLI `sandbox create` does — is killed when its
    timeout ends, not left paused; one that asks for a pause still gets it."""
    with httpx.Client(
        base_url=e2b_like.api_url, headers={"X-API-KEY": e2b_like.api_key}, timeout=30
    ) as c:
        plain = c.post("/v2/sandboxes", json={"templateID": "base", "timeout": 2}).json()
        asked = c.post(
            "/v2/sandboxes", json={"templateID": "base", "timeout": 2, "autoPause": True}
        ).json()  # the SDK's lifecycle
        assert c.get(f"/sandboxes/{plain['sandboxID']}").json()["lifecycle"]["onTimeout"] == "kill"
        eventually_sync(
            lambda: c.get(f"/sandboxes/{plain['sandboxID']}").status_code == 404,
            timeout=30,
            interval=0.5,
        )
        assert _kills(e2b_like, plain["sandboxID"]) == ["timeout"]
        eventually_sync(
            lambda: c.get(f"/sandboxes/{asked['sandboxID']}").json()["state"] == "paused",
            timeout=30,
            interval=0.5,
        )
        c.delete(f"/sandboxes/{asked['sandboxID']}")
