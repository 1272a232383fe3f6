import json
from pathlib import Path

import pytest

from workers.node.hosted import LocalCapture, capture_size, image_size
from workers.node.runtime import Snapshot
from workers.node.vmm import Machine


def test_manifest_round_trip(tmp_path: Path) -> None:
    m = Machine("7.2.22", "tcg", "max", 2, 512, "06:00:ac:10:00:02")
    runtime = tmp_path / "runtime-abc" / "runtime.ext4"
    runtime.parent.mkdir()
    runtime.write_bytes(b"")
    s = Snapshot(
        "s1",
        tmp_path,
        m,
        tmp_path / "top.qcow2",
        tmp_path / "base.ext4",
        runtime,
        "vm9",
        "2026-01-01T00:00:00+00:00",
        1234,
    )
    s.write()
    back = Snapshot.read(tmp_path)
    assert back == s
    assert json.loads((tmp_path / "manifest.json").read_text())["fingerprint"] == m.fingerprint()


def test_unknown_manifest_format_is_refused(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps({"format": 99}))
    with pytest.raises(ValueError, match="unknown snapshot format"):
        Snapshot.read(tmp_path)


def test_a_capture_from_another_node_finds_this_nodes_runtime_by_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The path the capturing node had is not this node's: the runtime of the same digest
    in this node's image cache is attached instead."""
    cache = tmp_path / "cache"
    mine = cache / "runtime-d1g35t"
    mine.mkdir(parents=True)
    (mine / "runtime.ext4").write_bytes(b"")
    (mine / "manifest.json").write_text(json.dumps({"digest": "d1g35t"}))
    monkeypatch.setenv("AENV_IMAGE_CACHE", str(cache))
    m = Machine("7.2.22", "tcg", "max", 2, 512, "06:00:ac:10:00:02")
    elsewhere = Path("/elsewhere/runtime-d1g35t/runtime.ext4")
    Snapshot("s1", tmp_path, m, tmp_path / "top", tmp_path / "base", elsewhere).write()
    assert Snapshot.read(tmp_path).runtime_disk == mine / "runtime.ext4"


def test_a_capture_keeps_the_content_digests_of_its_disks(tmp_path: Path) -> None:
    """What the capture's layers were written over travels with it (issue 40); a capture
    written before they were recorded reads back as None (it stays on its node)."""
    m = Machine("7.2.22", "tcg", "max", 2, 512, "06:00:ac:10:00:02")
    runtime = tmp_path / "runtime.ext4"
    runtime.write_bytes(b"")
    s = Snapshot(
        "s1", tmp_path, m, tmp_path / "top", tmp_path / "base", runtime,
        base_content="1" * 64, runtime_content="2" * 64,
    )  # fmt: skip
    s.write()
    doc = json.loads((tmp_path / "manifest.json").read_text())
    assert (doc["base_content"], doc["runtime_content"]) == ("1" * 64, "2" * 64)
    back = Snapshot.read(tmp_path)
    assert (back.base_content, back.runtime_content) == (s.base_content, s.runtime_content)
    for key in ("base_content", "runtime_content"):
        del doc[key]
    (tmp_path / "manifest.json").write_text(json.dumps(doc))
    old = Snapshot.read(tmp_path)
    assert (old.base_content, old.runtime_content) == (None, None)


def test_what_a_capture_and_the_disks_under_it_allocate(tmp_path: Path) -> None:
    """What its upload records for placement by disk (images-at-scale S9): the capture's
    own files, and apart the image and runtime disks under it (allocated bytes: a sparse
    disk counts what it holds); a disk not there counts nothing."""
    m = Machine("7.2.22", "tcg", "max", 2, 512, "06:00:ac:10:00:02")
    base, runtime = tmp_path / "base.ext4", tmp_path / "runtime.ext4"
    base.write_bytes(b"b" * 8192)
    with open(runtime, "wb") as f:  # sparse: 1 GiB long, one block written
        f.truncate(1 << 30)
        f.write(b"r" * 4096)
    snap = Snapshot("s1", tmp_path / "cap", m, tmp_path / "cap" / "top", base, runtime)
    snap.dir.mkdir()
    for p in (snap.mem, snap.state, snap.disk_top):
        p.write_bytes(b"c" * 4096)
    assert image_size(snap) == base.stat().st_blocks * 512 + runtime.stat().st_blocks * 512
    assert 12288 <= image_size(snap) < 1 << 20
    assert capture_size(snap) == sum(
        p.stat().st_blocks * 512 for p in (snap.mem, snap.state, snap.disk_top)
    )
    capture = LocalCapture.of(snap)
    assert (capture.size_bytes, capture.image_bytes) == (capture_size(snap), image_size(snap))
    runtime.unlink()
    assert image_size(snap) == base.stat().st_blocks * 512
