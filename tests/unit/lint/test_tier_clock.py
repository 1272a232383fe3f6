"""The tier clock's file spans: what the end of a CI run names as where its minutes went."""

from __future__ import annotations

import time
from pathlib import Path

from tests.tiers import SLOW, SLOW_VMLESS, TierClock, slow_lanes


def test_files_are_timed_from_their_first_start_to_their_last_end() -> None:
    clock = TierClock()
    clock.started("tests/e2e/test_a.py::test_one")
    time.sleep(0.05)
    clock.finished("tests/e2e/test_a.py::test_one")
    clock.started("tests/e2e/test_a.py::test_two")
    time.sleep(0.05)
    clock.finished("tests/e2e/test_a.py::test_two")
    clock.started("tests/e2e/test_b.py::test_one")
    clock.finished("tests/e2e/test_b.py::test_one")
    (slow, a), (quick, b) = clock.slowest_files(5)
    assert (slow, quick) == ("tests/e2e/test_a.py", "tests/e2e/test_b.py")
    assert a >= 0.1 > b
    assert clock.slowest_files(1) == [(slow, a)]
    assert clock.counts == {"e2e": 3}


def test_the_slow_lanes_hold_every_slow_test_once(tmp_path: Path) -> None:
    """The VM-less lane is what SLOW_VMLESS names; everything else of the slow tiers,
    a new integration directory or a test file at a tier's top included, runs with VMs."""
    for d in ("vmless_slow", "e2e", "e2e_cli", "fleet", "reliability"):
        (tmp_path / d).mkdir()
    for d in ("bus", "codeint", "envd", "projections", "stack", "image", "newthing"):
        (tmp_path / "integration" / d).mkdir(parents=True)
    (tmp_path / "integration" / "test_top.py").write_text("")
    (tmp_path / "integration" / "conftest.py").write_text("")
    vmless, vms = slow_lanes(tmp_path)
    assert vmless == [f"{tmp_path}/{d}" for d in SLOW_VMLESS]
    assert vms == [
        f"{tmp_path}/integration/image",
        f"{tmp_path}/integration/newthing",
        f"{tmp_path}/integration/test_top.py",
        f"{tmp_path}/e2e_cli",
        f"{tmp_path}/e2e",
        f"{tmp_path}/fleet",
        f"{tmp_path}/reliability",
    ]
    # and on the real tree: every directory of every slow tier is in exactly one lane
    tests = Path(__file__).resolve().parents[2]
    real_vmless, real_vms = slow_lanes(tests)
    assert not set(real_vmless) & set(real_vms)
    for tier in SLOW:
        lane = real_vms + real_vmless
        assert any(p == f"{tests}/{tier}" or p.startswith(f"{tests}/{tier}/") for p in lane)
