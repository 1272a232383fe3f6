"""What every request handler needs, built once per process by `create_app`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.ext.asyncio import AsyncEngine

from api.auth import KeyChecker
from api.metrics import Metrics
from bus import Bus


class ApiSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AENV_", frozen=True, extra="ignore")

    #: Upper bound on waiting for a create (restore + envd ready), then 504 with the command.
    create_timeout_s: float = Field(default=120.0, gt=0)
    #: Upper bound on waiting for other lifecycle outcomes (kill, pause, resume).
    command_timeout_s: float = Field(default=60.0, gt=0)
    #: `{port}-{id}.{domain}` host routing for the proxy; also returned as `domain`.
    sandbox_domain: str | None = None
    #: On TTL expiry: "pause" (aenv's default, nothing is lost) or "kill" (E2B's default).
    default_on_timeout: str = Field(default="pause", pattern=r"^(pause|kill)$")


WaitFor = Callable[[int], Awaitable[None]]


async def _no_wait(_: int) -> None:
    return None


@dataclass
class ApiContext:
    bus: Bus
    engine: AsyncEngine
    settings: ApiSettings
    keys: KeyChecker
    metrics: Metrics = field(default_factory=lambda: Metrics())
    #: Read-your-writes: returns once the sandboxes projection has folded stream seq `n`.
    wait_for: WaitFor = _no_wait
    #: Highest event sequence this process wrote or waited for: reads wait for the read
    #: model to reach it, so a GET after our own write sees it (and writes do not wait).
    fence: int = 0

    async def fenced(self) -> None:
        if self.fence:
            await self.wait_for(self.fence)
