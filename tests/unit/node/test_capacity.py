"""The node's room: memory and vCPUs with overcommit, a count cap, holds that are checked
and taken at once (creates run concurrently), paused sandboxes holding nothing."""

from pathlib import Path

from workers.node.capacity import Ledger, Size, host_memory_mib

BASE = Size(1, 512)


def ledger(**kw: object) -> Ledger:
    fields: dict[str, object] = {"vcpus": 2, "mem_mib": 2048, "max_sandboxes": 32}
    fields.update(kw)
    return Ledger(**fields)  # type: ignore[arg-type]


def test_memory_is_the_limit() -> None:
    led = ledger(vcpus=8)
    assert all(led.take(f"s{i}", BASE) for i in range(4))
    assert not led.take("s4", BASE)
    r = led.room()
    assert (r.free_mem_mib, r.free_vcpus, r.free_sandboxes) == (0, 4, 28)


def test_overcommit_stretches_the_budget() -> None:
    led = ledger(cpu_overcommit=4.0, memory_overcommit=1.5)  # 8 vCPUs, 3072 MiB
    assert (led.vcpus, led.mem_mib) == (8, 3072)
    assert sum(led.take(f"s{i}", BASE) for i in range(10)) == 6


def test_vcpus_are_the_limit() -> None:
    led = ledger(mem_mib=1 << 20)
    assert led.take("a", Size(2, 128))
    assert not led.take("b", Size(1, 128))


def test_the_count_cap() -> None:
    led = ledger(vcpus=64, mem_mib=1 << 20, max_sandboxes=2)
    assert led.take("a", BASE) and led.take("b", BASE)
    assert not led.take("c", BASE)


def test_release_gives_the_room_back_and_holding_again_is_a_no_op() -> None:
    led = ledger()
    assert led.take("a", Size(2, 2048))
    assert led.take("a", Size(2, 2048))  # a redelivered create of the same sandbox
    assert not led.fits(BASE)
    led.release("a")
    led.release("a")
    assert led.fits(BASE, count=2) and led.fits(Size(2, 2048))


def test_a_nodes_own_paused_sandbox_comes_back_whatever_the_room() -> None:
    led = ledger()
    assert led.take("new", Size(2, 2048))
    assert not led.take("mine", BASE)
    assert led.take("mine", BASE, force=True)
    assert led.room().free_mem_mib == 0  # never below zero


def test_fits_counts_a_fork_s_children() -> None:
    led = ledger(vcpus=8, mem_mib=1024)
    assert led.fits(BASE, 2) and not led.fits(BASE, 3)


def test_host_memory_from_meminfo(tmp_path: Path) -> None:
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       24632320 kB\nMemFree:        1000 kB\n")
    assert host_memory_mib(f) == 24055
