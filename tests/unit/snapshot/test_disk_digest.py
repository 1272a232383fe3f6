"""An image's content digest (`shared/diskdigest.py`): the chunk list the snapshot
repository stores a file as, so the same bytes give the same digest however sparse the
file is, other bytes another digest, and each chunk is named as `chunks.read_chunk` (the
upload's hashing) names it."""

from __future__ import annotations

import os
from pathlib import Path

from shared.diskdigest import ChunkList, chunk_list, disk_digest
from workers.snapshot import chunks

CS = 64 << 10  # small chunks: a few MiB make many


def _write(path: Path, size: int, data: dict[int, bytes], *, dense: bool) -> Path:
    with path.open("wb") as f:
        if dense:
            f.write(bytes(size))
        else:
            f.truncate(size)
        for offset, blob in data.items():
            f.seek(offset)
            f.write(blob)
    return path


def test_the_same_bytes_give_one_digest_however_sparse(tmp_path: Path) -> None:
    data = {0: os.urandom(5000), 3 * CS + 17: os.urandom(CS), 40 * CS: b"tail"}
    size = 40 * CS + 4 + 1000  # a short last chunk
    sparse = chunk_list(_write(tmp_path / "sparse", size, data, dense=False), CS)
    dense = chunk_list(_write(tmp_path / "dense", size, data, dense=True), CS)
    assert sparse == dense and sparse.digest == dense.digest
    assert (sparse.size, sparse.chunk_size, len(sparse.chunks)) == (size, CS, 41)
    present = [i for i, c in enumerate(sparse.chunks) if c is not None]
    assert present == [0, 3, 4, 40]  # zero chunks and holes are None
    fd = os.open(tmp_path / "dense", os.O_RDONLY)
    try:
        for i, c in enumerate(sparse.chunks):
            got = chunks.read_chunk(fd, i, CS, size)
            assert c == (got[0] if got is not None else None)
    finally:
        os.close(fd)


def test_other_bytes_or_another_size_give_another_digest(tmp_path: Path) -> None:
    base = chunk_list(_write(tmp_path / "a", 10 * CS, {CS: b"x" * 100}, dense=False), CS)
    flipped = chunk_list(_write(tmp_path / "b", 10 * CS, {CS: b"x" * 99 + b"y"}, dense=False), CS)
    longer = chunk_list(_write(tmp_path / "c", 10 * CS + 1, {CS: b"x" * 100}, dense=False), CS)
    assert len({base.digest, flipped.digest, longer.digest}) == 3
    # the digest is of the canonical list alone: key order and spacing do not matter
    assert base.digest == disk_digest(base.size, base.chunk_size, list(base.chunks))
    assert (
        ChunkList(base.size, base.chunk_size, tuple(base.as_json()["chunks"])).digest == base.digest
    )  # type: ignore[arg-type]


def test_an_empty_and_an_all_zero_file(tmp_path: Path) -> None:
    assert chunk_list(_write(tmp_path / "e", 0, {}, dense=False), CS).chunks == ()
    zeros = chunk_list(_write(tmp_path / "z", 3 * CS, {}, dense=True), CS)
    assert zeros.chunks == (None, None, None)
