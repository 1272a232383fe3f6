"""Fixtures of the domain tests: a sandbox in every lifecycle state."""

from __future__ import annotations

import pytest

from domain import sandbox as sb
from tests.unit.domain.builders import STATES


@pytest.fixture(params=sorted(STATES))
def any_state(request: pytest.FixtureRequest) -> sb.Sandbox:
    return STATES[request.param]()
