import os
from pathlib import Path

from shared.sparse import data_extents
from workers.snapshot import chunks

MIB = 1 << 20


def test_chunks_touching_covers_every_overlapped_chunk_once() -> None:
    cs = 4 * MIB
    assert chunks.chunks_touching([], cs) == []
    assert chunks.chunks_touching([(0, 1)], cs) == [0]
    assert chunks.chunks_touching([(cs - 1, cs + 1)], cs) == [0, 1]
    assert chunks.chunks_touching([(cs, 2 * cs)], cs) == [1]  # end is exclusive
    assert chunks.chunks_touching([(0, 10), (5, 20), (9 * cs, 9 * cs + 1)], cs) == [0, 9]


def test_chunk_count_rounds_up() -> None:
    assert chunks.chunk_count(0, 4) == 0
    assert chunks.chunk_count(8, 4) == 2
    assert chunks.chunk_count(9, 4) == 3


def test_nonzero_runs_merge_adjacent_pages() -> None:
    p = chunks.PAGE
    data = bytearray(8 * p)
    data[p + 5] = 1
    data[2 * p] = 1
    data[6 * p + p - 1] = 1
    assert chunks.nonzero_runs(bytes(data)) == [(p, 3 * p), (6 * p, 7 * p)]
    assert chunks.nonzero_runs(bytes(3 * p)) == []
    assert chunks.nonzero_runs(b"\x01" + bytes(10)) == [(0, 11)]  # a short tail page


def test_is_zero() -> None:
    assert chunks.is_zero(bytes(4 * MIB))
    assert not chunks.is_zero(bytes(4 * MIB - 1) + b"\x01")
    assert chunks.is_zero(b"")


def test_holes_are_not_data_and_zero_chunks_are_dropped(tmp_path: Path) -> None:
    path = tmp_path / "mem"
    cs = 1 * MIB
    with open(path, "wb") as f:
        f.truncate(16 * MIB)
        f.seek(3 * MIB + 100)
        f.write(os.urandom(5000))
        f.seek(9 * MIB)
        f.write(bytes(MIB))  # allocated zeros
    fd = os.open(path, os.O_RDONLY)
    try:
        extents = data_extents(fd, 16 * MIB)
        touched = chunks.chunks_touching(extents, cs)
        assert 3 in touched and 9 in touched and 0 not in touched
        assert chunks.read_chunk(fd, 9, cs, 16 * MIB) is None
        got = chunks.read_chunk(fd, 3, cs, 16 * MIB)
        assert got is not None and len(got[1]) == cs
    finally:
        os.close(fd)


def test_write_sparse_writes_only_nonzero_pages(tmp_path: Path) -> None:
    path = tmp_path / "out"
    data = bytes(2 * MIB) + os.urandom(8192) + bytes(2 * MIB)
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        os.ftruncate(fd, 8 * MIB)
        assert chunks.write_sparse(fd, MIB, data) == 8192
    finally:
        os.close(fd)
    raw = path.read_bytes()
    assert raw[MIB : MIB + len(data)] == data
    assert os.stat(path).st_blocks * 512 <= 64 * 1024
