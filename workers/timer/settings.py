"""The timer's settings (`AENV_*`), read once by the api role that runs it."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["TimerSettings"]


class TimerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AENV_", frozen=True, extra="ignore")

    #: Paused sandboxes are kept this long after their pause, then killed (reason
    #: `retention`, in the log) and their captures removed: aenv pauses on timeout by
    #: default, so without it every sandbox a client forgot stays on disk for ever. 0 keeps
    #: them for ever. (E2B's own default is to kill on timeout: AENV_DEFAULT_ON_TIMEOUT=kill.)
    paused_retention_s: float = Field(default=30 * 86_400, ge=0)
