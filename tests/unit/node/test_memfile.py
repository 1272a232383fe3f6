import hashlib
import os
from pathlib import Path

from workers.node.runtime import allocated_bytes, clone_or_sparse_copy


def test_sparse_copy_preserves_content_and_holes(tmp_path: Path) -> None:
    src = tmp_path / "mem"
    size = 64 << 20
    with open(src, "wb") as f:
        f.truncate(size)
        for off in (0, 5 << 20, 40 << 20, size - 4096):
            f.seek(off)
            f.write(os.urandom(4096) * 4 if off != size - 4096 else os.urandom(4096))
    dst = tmp_path / "copy"
    mode = clone_or_sparse_copy(src, dst)
    assert mode in ("reflink", "sparse")
    assert dst.stat().st_size == size
    h = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
    assert h(src) == h(dst)
    assert allocated_bytes(dst) <= allocated_bytes(src) + (1 << 20)
    assert allocated_bytes(dst) < size // 4  # holes stayed holes


def test_copy_of_an_all_hole_file(tmp_path: Path) -> None:
    src = tmp_path / "empty"
    with open(src, "wb") as f:
        f.truncate(8 << 20)
    dst = tmp_path / "copy"
    clone_or_sparse_copy(src, dst)
    assert dst.stat().st_size == 8 << 20
    assert allocated_bytes(dst) == 0
