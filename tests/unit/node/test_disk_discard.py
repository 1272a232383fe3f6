"""A removal killed midway leaves nothing for ever (issue 42): an entry is renamed aside
(`.gone-<name>`) before it is deleted, and what a kill leaves — `.gone-*`, an image dir
without its manifest from older code, a dead builder's `.tmp-*` — is swept; never a
scratch whose builder still holds its lock. Real files; the kill is a real SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workers.node.disk.categories import IMAGES
from workers.node.disk.evictor import CacheEvictor
from workers.node.disk.usage import allocated, scan
from workers.node.image import cache

MiB = 1 << 20
BIG = "b" * 64
DIRS = 100  # of 100 files each: big enough that its deletion takes a while

_REMOVE = """
import sys
from pathlib import Path
from workers.node.disk.evictor import CacheEvictor
evictor = CacheEvictor(Path(sys.argv[1]), None)
[entry] = [e for e in evictor.entries() if e.key == sys.argv[2]]
evictor.remove(entry)
"""


def _image(root: Path, name: str, dirs: int = 0, files: int = 0) -> Path:
    d = root / "images" / name
    d.mkdir(parents=True)
    (d / "root.ext4").write_bytes(os.urandom(MiB))
    for i in range(dirs):
        (d / "tree" / str(i)).mkdir(parents=True)
        for j in range(files):
            (d / "tree" / str(i) / str(j)).write_bytes(b"x" * 4096)
    (d / "manifest.json").write_text("{}")
    (root / "recipes").mkdir(exist_ok=True)
    (root / "recipes" / f"r-{name}").symlink_to(f"../images/{name}")
    return d


def _du(path: Path) -> int:
    out = subprocess.run(["du", "-sx", "--block-size=1", str(path)], capture_output=True, text=True)
    return int(out.stdout.split()[0])


def _kill_mid_removal(root: Path, entry: Path) -> None:
    """Run `CacheEvictor.remove` of `entry` in a process, SIGKILLed once the entry is
    renamed aside and some of its tree is gone."""
    gone = entry.with_name(f".gone-{entry.name}")
    proc = subprocess.Popen(
        [sys.executable, "-c", _REMOVE, str(root), str(entry)],
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if len(os.listdir(gone / "tree")) < DIRS:
                    break  # a part of the tree deleted, the rest not yet
            except OSError:
                pass
            time.sleep(0.0005)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the removal ended before the kill"


def test_a_removal_killed_midway_leaves_no_trace_after_a_sweep(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    _image(root, "a" * 64)  # another image, which stays
    (root / ".locks").mkdir()
    before = _du(root)
    big = _image(root, BIG, dirs=DIRS, files=100)
    assert _du(root) > before + 32 * MiB

    _kill_mid_removal(root, big)
    gone = big.with_name(f".gone-{BIG}")
    assert not big.exists() and gone.is_dir(), "the kill landed mid-removal"
    assert not (root / "recipes" / f"r-{BIG}").exists()

    fresh = CacheEvictor(root, None)
    assert [e.key for e in fresh.entries()] == [str(root / "images" / ("a" * 64))]
    assert not gone.exists()  # the listing swept it
    assert abs(_du(root) - before) <= MiB
    assert abs(scan([(IMAGES, root)]).total - _du(root)) <= MiB  # and the walk agrees


def test_the_sweep_at_start_removes_what_older_code_and_dead_builders_left(
    tmp_path: Path,
) -> None:
    root = tmp_path / "cache"
    kept = _image(root, "a" * 64)
    half = root / "images" / ("c" * 64)  # the old removal: manifest unlinked, then killed
    (half / "tree").mkdir(parents=True)
    (half / "tree" / "f").write_bytes(os.urandom(MiB))
    dead = root / f".tmp-{'d' * 64}-abc_12"  # its builder died
    (dead / "tree").mkdir(parents=True)
    chain = root / "layers" / ".gone-sha256-1"  # a chain's removal, killed
    (chain / "tree").mkdir(parents=True)
    live = root / f".tmp-content-{'e' * 64}-xyz"
    kernel = root / ".tmp-kernel-6.1.0-18-amd64-6.1.76-1-k3y"
    evictor = CacheEvictor(root, None)
    with cache.locked(root, f"content-{'e' * 64}"), cache.locked(root, "kernel"):
        live.mkdir()  # a fetch and a kernel build are writing theirs
        kernel.mkdir()
        evictor.sweep()
        assert live.is_dir() and kernel.is_dir()
    assert not half.exists() and not dead.exists() and not chain.exists()
    assert kept.is_dir() and (kept / "manifest.json").is_file()
    evictor.sweep()  # their builders gone (they would have removed them): swept now
    assert not live.exists() and not kernel.exists()
    assert [e.key for e in evictor.entries()] == [str(kept)]


@pytest.mark.parametrize("category", ["chain", "rootfs_tree"])
def test_a_tree_is_renamed_aside_before_it_is_deleted(tmp_path: Path, category: str) -> None:
    root = tmp_path / "cache"
    tree = root / "layers" / "sha256-1" if category == "chain" else root / "rootfs-ab"
    (tree / "tree").mkdir(parents=True)
    (tree / "tree" / "f").write_bytes(os.urandom(MiB))
    evictor = CacheEvictor(root, None)
    [entry] = evictor.entries()
    size = allocated(tree)
    assert evictor.remove(entry) == size
    assert not tree.exists() and not tree.with_name(f".gone-{tree.name}").exists()
