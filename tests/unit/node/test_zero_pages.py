"""A template capture's RAM file loses its zero pages as holes, and reads back the same
(`memfile.punch_zero_pages`, on a real sparse file)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from workers.node.runtime.memfile import PAGE, allocated_bytes, punch_zero_pages, zero_runs

MIB = 1 << 20


def test_zero_runs_are_whole_pages() -> None:
    data = bytes(PAGE) + b"x" + bytes(2 * PAGE - 1) + bytes(PAGE) * 2 + b"y" * 10
    assert zero_runs(data) == [(0, PAGE), (2 * PAGE, 5 * PAGE)]
    assert zero_runs(bytes(3 * PAGE + 7)) == [(0, 3 * PAGE)]  # a part page is kept
    assert zero_runs(b"") == []


def test_zero_pages_become_holes_and_the_file_reads_the_same(tmp_path: Path) -> None:
    mem = tmp_path / "mem"
    with open(mem, "wb") as f:
        f.truncate(64 * MIB)
        f.write(os.urandom(2 * MIB))  # data
        f.write(bytes(3 * MIB))  # touched, zero: allocated
        f.write(os.urandom(PAGE) + bytes(PAGE) + os.urandom(PAGE))  # a zero page between
        f.seek(40 * MIB)
        f.write(bytes(MIB))  # a zero run alone past a hole
    before = hashlib.sha256(mem.read_bytes()).hexdigest()
    allocated = allocated_bytes(mem)
    freed = punch_zero_pages(mem)
    assert freed == allocated - allocated_bytes(mem)
    assert freed >= 4 * MIB + PAGE
    assert allocated_bytes(mem) <= 2 * MIB + 2 * PAGE + 64 * 1024  # the data (and metadata)
    assert os.stat(mem).st_size == 64 * MIB
    assert hashlib.sha256(mem.read_bytes()).hexdigest() == before
