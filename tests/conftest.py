"""Test-suite wide configuration. Tier-specific fixtures live in each tier's conftest."""

from __future__ import annotations

import pytest

from tests.tiers import TierClock


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(TierClock(), "aenv-tier-clock")
