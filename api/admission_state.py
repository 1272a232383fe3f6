"""What one API process keeps for admission control (`api/admission.py`): the sandboxes it
admitted that the read model may not show yet, a lock per team, the handle of the fleet's
token buckets, the parsed per-team overrides. Apart from the decisions so that the
request context (`api.context.ApiContext`) can own one without importing them."""

from __future__ import annotations

import asyncio
import time

from pydantic import TypeAdapter

from bus import Bus
from bus.ratebuckets import RateBuckets
from domain.limits import Limits
from projections.census import HOLDS_A_VM, TeamCensus

__all__ = ["CENSUS_TTL_S", "TEAM_LIMITS", "AdmissionState"]

#: States of a sandbox that will never hold a VM again.
ENDED = ("killed", "failed")
#: How long a team's census from the read model admits more creates without a new query.
#: Never too few counted: what this API admitted since is held beside it (`held`); what
#: ended since is still counted, so a refusal always asks the read model again first.
CENSUS_TTL_S = 0.25

#: `AENV_TEAM_LIMITS`' shape: team id → its overrides.
TEAM_LIMITS = TypeAdapter(dict[str, Limits])


class AdmissionState:
    def __init__(self) -> None:
        self._held: dict[str, dict[str, float]] = {}  # team → sandbox id → held until
        #: team → the held ids that are new sandboxes (a create's, a fork's children): the
        #: read model counts one rightly from its first row on, whatever its state
        self._new: dict[str, set[str]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._buckets: RateBuckets | None = None
        self._teams: dict[str, Limits] | None = None
        self._censuses: dict[str, tuple[float, TeamCensus]] = {}

    def team_limits(self, raw: str) -> dict[str, Limits]:
        """The per-team overrides `raw` (`AENV_TEAM_LIMITS`) says, parsed once."""
        if self._teams is None:
            self._teams = TEAM_LIMITS.validate_json(raw or "{}")
        return self._teams

    def lock(self, team_id: str) -> asyncio.Lock:
        """Held while one request of the team is checked and admitted."""
        return self._locks.setdefault(team_id, asyncio.Lock())

    async def buckets(self, bus: Bus) -> RateBuckets:
        if self._buckets is None:
            self._buckets = RateBuckets(await bus.js.key_value(bus.names.admission_bucket))
        return self._buckets

    def held(self, team_id: str) -> dict[str, float]:
        """The team's admitted ids still counted here (expired ones dropped): id → until
        (monotonic; infinite while its request runs)."""
        now = time.monotonic()
        held = self._held.setdefault(team_id, {})
        new = self.new(team_id)
        for sid in [s for s, until in held.items() if until <= now]:
            del held[sid]
            new.discard(sid)
        return held

    def new(self, team_id: str) -> set[str]:
        """The team's held ids that are new sandboxes (the others are resumes)."""
        return self._new.setdefault(team_id, set())

    def census(self, team_id: str) -> TeamCensus | None:
        """The team's last census if younger than `CENSUS_TTL_S`."""
        at, census = self._censuses.get(team_id, (0.0, None))
        return census if census is not None and time.monotonic() - at < CENSUS_TTL_S else None

    def counted(self, team_id: str, census: TeamCensus) -> None:
        """Keep a fresh `census`: the held ids it counts rightly from now on leave `held` —
        a new sandbox once it has a row at all (created, then paused before any census saw it
        running, it was counted here as running until it aged out), a resumed one once its
        row holds a VM (or is gone: its row said paused when it was admitted)."""
        self._censuses[team_id] = (time.monotonic(), census)
        held, new = self.held(team_id), self.new(team_id)
        for sid, status in census.seen.items():
            if sid in new or status in HOLDS_A_VM or status in ENDED:
                held.pop(sid, None)
                new.discard(sid)
