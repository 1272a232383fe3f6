"""Admission limits of a team, decided without I/O: how many sandboxes it may have running
and how fast it may start new ones (issue 32).

`Limits` is what a key, a team or the defaults say, each field optional (None: not said
here, ask the next); `resolve` picks field by field, key → team → defaults, and names where
each value came from so a refusal can say which setting to change. The creation rate is a
token bucket kept as GCRA's one number (the *theoretical arrival time*, TAT): a bucket of
`burst` tokens refilled at `creates_per_s` is full when TAT ≤ now; taking `n` tokens moves
TAT by `n / rate`, allowed while TAT stays within `burst / rate` of now. One float per
bucket is what makes it cheap to keep fleet-wide (`api/admission.py` keeps it in a NATS KV
entry, compare-and-set).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Effective", "Limits", "RateDecision", "resolve", "take_tokens"]


class Limits(BaseModel):
    """Limits one source sets; None leaves a field to the next source, 0 means no limit."""

    model_config = ConfigDict(frozen=True, extra="ignore")  # newer logs: ignored

    #: Sandboxes the team may have running (creating, running, resuming …; paused ones
    #: hold no VM and do not count).
    max_sandboxes: int | None = Field(default=None, ge=0)
    #: Sandboxes per second the team may start (creates and fork children).
    creates_per_s: float | None = Field(default=None, ge=0)
    #: How many of them may start at once on a full bucket (0: one second's worth).
    burst: int | None = Field(default=None, ge=0)

    def is_empty(self) -> bool:
        return self.max_sandboxes is None and self.creates_per_s is None and self.burst is None


@dataclass(frozen=True)
class Effective:
    """The limits that apply to one caller, and where each came from (`key <id>`,
    `team <id>`, or the setting's name)."""

    max_sandboxes: int
    max_from: str
    creates_per_s: float
    burst: int
    rate_from: str
    #: The bucket the rate is counted in: the key's own when the key sets the rate (or the
    #: burst), else the team's.
    bucket: str

    @property
    def limited(self) -> bool:
        return self.max_sandboxes > 0 or self.creates_per_s > 0


def resolve(
    team_id: str,
    key_id: str,
    key: Limits | None,
    team: Limits | None,
    default: Limits,
    *,
    names: tuple[str, str] = ("AENV_TEAM_MAX_SANDBOXES", "AENV_TEAM_CREATES_PER_S"),
) -> Effective:
    """Field by field, the first source that says: the key's, the team's, the defaults'
    (`names`: what the defaults are called, for messages)."""
    sources = [(key, f"key {key_id}"), (team, f"team {team_id}"), (default, "")]

    def pick(field: str, default_name: str) -> tuple[float, str]:
        for limits, name in sources:
            value = getattr(limits, field) if limits is not None else None
            if value is not None:
                return value, name or default_name
        return 0, default_name

    max_sandboxes, max_from = pick("max_sandboxes", names[0])
    rate, rate_from = pick("creates_per_s", names[1])
    burst, _ = pick("burst", names[1])
    own_rate = key is not None and (key.creates_per_s is not None or key.burst is not None)
    return Effective(
        max_sandboxes=int(max_sandboxes),
        max_from=max_from,
        creates_per_s=float(rate),
        burst=int(burst) or max(1, math.ceil(rate)),
        rate_from=rate_from,
        bucket=f"key.{key_id}" if own_rate else f"team.{team_id}",
    )


@dataclass(frozen=True)
class RateDecision:
    allowed: bool
    #: The bucket's TAT to store when allowed (unchanged when refused).
    tat: float
    #: Seconds until the same request would be allowed (0 when allowed).
    retry_after_s: float


def take_tokens(
    tat: float | None, now: float, *, rate: float, burst: int, n: int = 1
) -> RateDecision:
    """Take `n` tokens from a bucket of `burst` refilled at `rate` per second whose TAT is
    `tat` (None: never used, full). More than `burst` at once (a big fork) passes on a full
    bucket only, and leaves it in debt for the excess."""
    if rate <= 0:
        return RateDecision(True, tat or now, 0.0)
    interval = 1.0 / rate
    start = now if tat is None else max(tat, now)
    new_tat = start + n * interval
    if n > burst:
        if start <= now:
            return RateDecision(True, new_tat, 0.0)
        return RateDecision(False, start, start - now)
    over = new_tat - now - burst * interval
    if over <= 1e-9:
        return RateDecision(True, new_tat, 0.0)
    return RateDecision(False, start, over)
