"""An import killed -9 (issue 42): while it removes what it no longer needs — a finished
import's tidy (`leftovers.tidy_after_import`), a failed import's cleanup
(`forget_on_failure`) — and before it removes anything. Each is a real import's steps in
a process of its own (`importpass`: skopeo from a registry on loopback, the unpack through
the chain cache; all but the guest image build, which needs a kernel). A removal is
killed once it has begun (the layer it removes first is gone) and before it ends.

What it had made or not removed yet must not stay for ever: the node's start (a kill -9
of an import is one of the node) and the next import finish it from its record in
`.tidy/`, and the cache is then what a cache where nothing was killed holds (`du` within
1 MiB, the same blobs, chains and layouts).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.image.importpass import import_steps
from tests.registry import LocalRegistry, busybox_tree, import_registry, push
from workers.node.image.errors import ImageError
from workers.node.image.leftovers import TIDY, blob_file, finish_interrupted
from workers.node.image.oci_write import tar_tree, write_layout

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

MiB = 1 << 20
#: files in the layer whose chain the killed removal deletes: its `rmtree` lasts long
#: enough to be killed in
FILES = 2500
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[LocalRegistry]:
    yield from import_registry(tmp_path)


def _du(path: Path) -> int:
    out = subprocess.run(["du", "-sB1", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def _names(root: Path) -> dict[str, set[str]]:
    def ls(d: Path) -> set[str]:
        return {p.name for p in d.iterdir()} if d.is_dir() else set()

    return {
        "blobs": ls(root / "blobs" / "sha256"),
        "chains": ls(root / "layers"),
        "layouts": ls(root / "oci"),
        "plans": ls(root / TIDY),
    }


def _many_files(tmp: Path, name: str) -> bytes:
    """A layer of `FILES` small files (a tree whose chain takes a while to remove)."""
    tree = tmp / name
    d = tree / "data" / name
    d.mkdir(parents=True)
    for i in range(FILES):
        (d / f"f{i}").write_bytes(i.to_bytes(4, "big"))
    return tar_tree(tree)


def _digest(blob: bytes) -> str:
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def _went(path: Path) -> Callable[[], bool]:
    """Whether `path` was seen and is gone since (a removal under way)."""
    seen = False

    def probe() -> bool:
        nonlocal seen
        if path.exists():
            seen = True
            return False
        return seen

    return probe


def _kill_when(root: Path, ref: str, ready: Callable[[], bool]) -> None:
    """Import in a process of its own; SIGKILL it (and skopeo, its child: a node's whole
    cgroup goes) as soon as `ready`, and before it ends: its record stays in `.tidy/`."""
    env = {**os.environ, "AENV_IMAGE_CACHE": str(root), "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "tests.integration.image.importpass", ref]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stderr=subprocess.PIPE, start_new_session=True)
    try:
        while proc.poll() is None and not ready():
            time.sleep(0.002)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL, proc.stderr.read() if proc.stderr else None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert any((root / TIDY).glob("*.json")), "the kill left no record"


def _same(killed: Path, clean: Path) -> None:
    assert _names(killed) == _names(clean)
    assert abs(_du(killed) - _du(clean)) <= MiB, (_du(killed), _du(clean))


def test_an_import_killed_while_it_removes_leaves_nothing_for_ever(
    registry: LocalRegistry, tmp_path: Path
) -> None:
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    base = tar_tree(busybox_tree(tmp_path / "base"))
    top = _many_files(tmp_path, "top")
    write_layout(tmp_path / "good", [base, top])
    good = push(tmp_path / "good", registry, "t/good")
    mid = _many_files(tmp_path, "mid")
    (tmp_path / "last" / "data").mkdir(parents=True)
    (tmp_path / "last" / "data" / "last").write_bytes(os.urandom(MiB))
    last = tar_tree(tmp_path / "last")
    diff_ids = [_digest(gzip.decompress(b)) for b in (base, mid, last)]
    write_layout(  # the last layer cut short: the unpack fails after `mid` is kept
        tmp_path / "bad",
        [base, mid, last[: len(last) * 9 // 10]],
        config={"rootfs": {"type": "layers", "diff_ids": diff_ids}},
    )
    bad = push(tmp_path / "bad", registry, "t/bad")
    blobs = killed / "blobs"
    # a finished import's tidy, killed: the node's start finishes it
    import_steps(good, clean)
    _kill_when(killed, good, _went(blob_file(blobs, _digest(top))))
    assert finish_interrupted(killed) == 1
    _same(killed, clean)

    # a failed import's cleanup, killed: the next import finishes it
    with pytest.raises(ImageError, match="corrupt gzip"):
        import_steps(bad, clean)
    _kill_when(killed, bad, _went(blob_file(blobs, _digest(mid))))
    for root in (clean, killed):
        import_steps(good, root)
    _same(killed, clean)

    # an import killed before it removes anything (once its layer is pulled): what it
    # made goes at the node's start, as if it had failed
    third = _many_files(tmp_path, "third")
    write_layout(tmp_path / "third", [base, third])
    ref = push(tmp_path / "third", registry, "t/third")
    _kill_when(killed, ref, blob_file(blobs, _digest(third)).exists)
    assert finish_interrupted(killed) == 1
    _same(killed, clean)
