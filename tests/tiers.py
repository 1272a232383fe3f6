"""The suite's tiers, in the order `make test` runs them, and the time each one took.

Fast tiers come first (no VM: pure tests, recorded histories, static checks, the real
services with an in-memory host), so a broken fold or route fails in the first minutes of
a run instead of after four VM stacks. The order is the command line's (`scripts/test.sh`
passes the tiers in this order); this plugin only measures: each tier's wall time from its
first test's setup to its last test's teardown, printed at the end of the run and written
as JSON to `$AENV_TIER_TIMES` when that is set (the README's table comes from it).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

__all__ = ["FAST", "SLOW", "SLOW_VMLESS", "TierClock", "slow_lanes", "tier_of"]

#: No VM, no root: `make test-fast` (issue 27: under 3 minutes on the 2-core host)
FAST = ("unit", "golden", "deploy", "contract", "vmless")
#: The VM-less stack under faults (minutes of waiting out restarts), then real QEMU
#: microVMs (and the fleet's NATS cluster): after every fast tier
SLOW = ("vmless_slow", "integration", "e2e_cli", "e2e", "fleet", "reliability")
#: The slow tests that start no VM: `scripts/test.sh` runs them in a process of their own
#: beside the VM tiers (they wait on restarts, outages and deadlines far more than they
#: compute, about 12 minutes of CI's wall time otherwise). A directory not named here runs
#: with the VMs: a new integration directory is taken to need them until listed.
SLOW_VMLESS = (
    "vmless_slow",
    "integration/bus",
    "integration/codeint",
    "integration/envd",
    "integration/projections",
    "integration/stack",
)


def slow_lanes(tests: Path) -> tuple[list[str], list[str]]:
    """The slow tiers' test paths under `tests` as (VM-less, with VMs), in tier order."""
    vmless = [f"{tests}/{d}" for d in SLOW_VMLESS]
    vms: list[str] = []
    for tier in SLOW:
        if tier in SLOW_VMLESS:
            continue
        listed = [d for d in SLOW_VMLESS if d.startswith(f"{tier}/")]
        if not listed:
            vms.append(f"{tests}/{tier}")
            continue
        for sub in sorted((tests / tier).iterdir()):
            top_test = sub.is_file() and sub.name.startswith("test_") and sub.suffix == ".py"
            tests_dir = sub.is_dir() and sub.name != "__pycache__"
            if (top_test or tests_dir) and f"{tier}/{sub.name}" not in listed:
                vms.append(f"{tests}/{tier}/{sub.name}")
    return vmless, vms


#: how many files the end of a run names as the slowest (CI's log keeps only its tail)
FILES_SHOWN = 25


def tier_of(nodeid: str) -> str:
    """`tests/unit/api/test_x.py::test_y` → `unit`."""
    parts = nodeid.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0]


class TierClock:
    """Per tier: (first start, last end, tests) on the monotonic clock."""

    def __init__(self) -> None:
        self.spans: dict[str, list[float]] = {}
        self.counts: dict[str, int] = {}
        #: the same per test file: where a slow tier's minutes go (fixtures included)
        self.files: dict[str, list[float]] = {}

    def started(self, nodeid: str) -> None:
        tier = tier_of(nodeid)
        now = time.monotonic()
        self.spans.setdefault(tier, [now, now])  # a tier's first test starts its span
        self.counts[tier] = self.counts.get(tier, 0) + 1
        self.files.setdefault(nodeid.split("::")[0], [now, now])

    def finished(self, nodeid: str) -> None:
        now = time.monotonic()
        for span in (self.spans.get(tier_of(nodeid)), self.files.get(nodeid.split("::")[0])):
            if span is not None:
                span[1] = max(span[1], now)

    def slowest_files(self, n: int) -> list[tuple[str, float]]:
        """The `n` files whose tests took the longest, first test's start to last's end
        (a file's tests run together in one process; under xdist the spans overlap)."""
        spans = ((f, end - start) for f, (start, end) in self.files.items())
        return sorted(spans, key=lambda fs: -fs[1])[:n]

    def seconds(self) -> dict[str, float]:
        return {tier: round(end - start, 1) for tier, (start, end) in self.spans.items()}

    @pytest.hookimpl
    def pytest_runtest_logstart(self, nodeid: str, location: object) -> None:
        self.started(nodeid)

    @pytest.hookimpl
    def pytest_runtest_logfinish(self, nodeid: str, location: object) -> None:
        self.finished(nodeid)

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        times = self.seconds()
        if not times:
            return
        terminalreporter.section("tier durations")
        for tier, seconds in times.items():
            n = self.counts[tier]
            terminalreporter.write_line(f"{tier:<12} {seconds:8.1f} s  {n:5d} tests")
        terminalreporter.section("slowest files")
        for path, seconds in self.slowest_files(FILES_SHOWN):
            terminalreporter.write_line(f"{seconds:8.1f} s  {path}")
        out = os.environ.get("AENV_TIER_TIMES")
        if out:
            body = {t: {"seconds": s, "tests": self.counts[t]} for t, s in times.items()}
            Path(out).write_text(json.dumps(body, indent=2) + "\n")
