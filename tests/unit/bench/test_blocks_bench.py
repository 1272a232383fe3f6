"""The block-service bench reads QEMU's tool output: the formats qemu-img bench and qemu-io
7.2 print (copied from real runs)."""

from __future__ import annotations

import pytest

from bench.blocks_bench import op_seconds, run_seconds

QEMU_IMG_BENCH = (
    "Sending 512 read requests, 1048576 bytes each, 8 in parallel"
    " (starting at offset 0, step size 1048576)\nRun completed in 0.448 seconds.\n"
)
QEMU_IO = """read 65536/65536 bytes at offset 1048576
64 KiB, 1 ops; 00.00 sec (812.672 MiB/sec and 13002.7518 ops/sec)
read 65536/65536 bytes at offset 0
64 KiB, 1 ops; 0:00:00.02 (2.500 MiB/sec and 40.0000 ops/sec)
"""


def test_the_run_time_of_qemu_img_bench() -> None:
    assert run_seconds(QEMU_IMG_BENCH) == 0.448
    with pytest.raises(ValueError):
        run_seconds("qemu-img: Could not open")


def test_each_op_time_of_qemu_io_from_its_rate() -> None:
    got = op_seconds(QEMU_IO)
    assert len(got) == 2
    assert got[0] == pytest.approx(1 / 13002.7518) and got[1] == pytest.approx(0.025)
