"""The density bench's arithmetic (issue 33): PSS per VM over guest RAM, sandboxes per GiB
used against nominal, the raw rig's guest write command."""

from __future__ import annotations

from bench.density_bench import memory_figures, per_gib
from bench.raw_rig import write_command
from workers.node.usage import Smaps

MIB = 1 << 20


def test_figures_of_idle_vms() -> None:
    guest = 512 * MIB
    vms = [Smaps(rss=120 * MIB, pss=100 * MIB, shared=20 * MIB, private=100 * MIB)] * 4
    f = memory_figures(vms, guest)
    assert f["n"] == 4
    assert f["pss_mib_per_vm"]["p50"] == 100
    assert f["pss_over_guest_ram"]["p50"] == round(100 / 512, 3)
    assert f["pss_mib_sum"] == 400 and f["nominal_mib_sum"] == 2048
    assert f["shared_mib_sum"] == 80 and f["private_mib_sum"] == 400
    assert f["per_gib_used_pss"] == 10.24  # 1024 MiB / 100 MiB each
    assert f["per_gib_nominal"] == 2.0
    assert f["nominal_over_used_pss"] == 5.12
    assert memory_figures([], guest) == {"n": 0}


def test_per_gib_of_nothing_is_none() -> None:
    assert per_gib(3, 0) is None and per_gib(0, 1 << 30) is None
    assert per_gib(1, 1 << 30) == 1.0


def test_the_write_is_random_and_never_synced() -> None:
    cmd = write_command(256, "/home/user/x")
    assert "head -c 256M /dev/urandom > /home/user/x" in cmd
    assert "sync" not in cmd
