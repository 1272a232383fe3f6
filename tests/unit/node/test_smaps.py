"""A QEMU's memory from `smaps_rollup` (issue 33): the parser on recorded text, the node's
sum over its VMs and their nominal guest RAM, and the series a scrape shows."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from workers.node.metrics import MEMORY_KINDS, NodeMetrics, guest_memory
from workers.node.usage import Smaps, parse_smaps_rollup, read_smaps

#: a warm VM's QEMU (512 MiB guest, TCG) on this project's host, kernel 6.18
QEMU_ROLLUP = """\
5651795b9000-7ffca37b7000 ---p 00000000 00:00 0                          [rollup]
Rss:              140024 kB
Pss:              118421 kB
Pss_Dirty:         68040 kB
Pss_Anon:          66268 kB
Pss_File:          52153 kB
Pss_Shmem:             0 kB
Shared_Clean:      22680 kB
Shared_Dirty:          0 kB
Private_Clean:     49304 kB
Private_Dirty:     68040 kB
Referenced:       140024 kB
Anonymous:         66268 kB
KSM:                   0 kB
LazyFree:              0 kB
AnonHugePages:     45056 kB
ShmemPmdMapped:        0 kB
FilePmdMapped:         0 kB
Shared_Hugetlb:        0 kB
Private_Hugetlb:       0 kB
Swap:                  0 kB
SwapPss:               0 kB
Locked:                0 kB
"""
#: a fork child's: most of its guest RAM is the capture's pages, mapped by its siblings too
CHILD_ROLLUP = """\
55d0c6a4e000-7ffd5a3f1000 ---p 00000000 00:00 0                          [rollup]
Rss:               98304 kB
Pss:               41000 kB
Shared_Clean:      60000 kB
Shared_Dirty:        304 kB
Private_Clean:      2000 kB
Private_Dirty:     36000 kB
"""
KIB = 1024


def test_the_rollup_of_a_qemu_is_parsed_into_bytes() -> None:
    m = parse_smaps_rollup(QEMU_ROLLUP)
    assert m == Smaps(
        rss=140024 * KIB,
        pss=118421 * KIB,
        shared=22680 * KIB,  # Shared_Clean + Shared_Dirty
        private=(49304 + 68040) * KIB,  # Private_Clean + Private_Dirty
    )
    assert m.rss == m.shared + m.private  # what the kernel's own accounting says


def test_pss_dirty_and_others_are_not_taken_for_pss() -> None:
    # `Pss_Dirty:`, `Pss_Anon:` … start with "Pss" too: only the field itself counts
    m = parse_smaps_rollup("Pss_Dirty: 7 kB\nPss: 5 kB\nSwapPss: 9 kB\nbroken line\nRss: x kB\n")
    assert m == Smaps(pss=5 * KIB)
    assert parse_smaps_rollup("") == Smaps()


def test_the_node_sums_its_vms_and_their_nominal_ram(tmp_path: Path) -> None:
    for pid, text in ((101, QEMU_ROLLUP), (102, CHILD_ROLLUP)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "smaps_rollup").write_text(text)
    total, nominal = guest_memory({101: 512, 102: 512, 103: 1024}, proc=str(tmp_path))
    one, child = parse_smaps_rollup(QEMU_ROLLUP), parse_smaps_rollup(CHILD_ROLLUP)
    assert total == one + child
    assert total.shared == (22680 + 60000 + 304) * KIB
    assert total.pss == (118421 + 41000) * KIB
    assert nominal == 1024 << 20  # 103 is gone: on neither side
    assert sum([one, child], Smaps()) == total
    assert read_smaps(103, str(tmp_path)) is None


def test_a_live_process_reads() -> None:
    m = read_smaps(os.getpid())
    assert m is not None and 0 < m.pss <= m.rss and m.shared + m.private == m.rss


def test_the_series_show_the_sum_and_start_at_zero() -> None:
    m = NodeMetrics("n1")

    def values() -> dict[tuple[str, str], float]:
        text = asyncio.run(m.scrape.render()).decode()
        return {
            (s.name, s.labels.get("kind", "")): s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name in ("aenv_node_guest_memory_bytes", "aenv_node_guest_ram_bytes")
        }

    assert values() == {
        **{("aenv_node_guest_memory_bytes", k): 0.0 for k in MEMORY_KINDS},
        ("aenv_node_guest_ram_bytes", ""): 0.0,
    }
    m.read_guest_memory(parse_smaps_rollup(CHILD_ROLLUP), 512 << 20)
    v = values()
    assert v[("aenv_node_guest_memory_bytes", "shared")] == (60000 + 304) * KIB
    assert v[("aenv_node_guest_memory_bytes", "private")] == 38000 * KIB
    assert v[("aenv_node_guest_memory_bytes", "pss")] == 41000 * KIB
    assert v[("aenv_node_guest_ram_bytes", "")] == 512 << 20
