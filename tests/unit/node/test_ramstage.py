"""RAM copies of running VMs staged in memory: what the snapshot's `mem` path reads at each
step (staged, settled, discarded), and the fallbacks to a plain copy on disk. Uses real
tmpfs (`/dev/shm`) where the host has it, plus the node's own filesystem."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from workers.node.runtime.memfile import allocated_bytes
from workers.node.runtime.ramstage import SHM, RamStage

MIB = 1 << 20


@pytest.fixture
def ram(tmp_path: Path) -> Path:
    """A 64 MiB 'RAM file' with 3 MiB of data in three extents, the rest holes."""
    path = tmp_path / "ram"
    with open(path, "wb") as f:
        f.truncate(64 * MIB)
        for i, at in enumerate((0, 20 * MIB, 63 * MIB)):
            f.seek(at)
            f.write(bytes([i + 1]) * MIB)
    return path


@pytest.fixture
def stage(tmp_path: Path) -> RamStage:
    shm = SHM if SHM.is_dir() else tmp_path / "shm"
    shm.mkdir(exist_ok=True)
    (tmp_path / "state").mkdir()
    s = RamStage.for_state(tmp_path / "state", shm=shm)
    s.reset()
    yield s
    s.close()


def test_a_copy_is_staged_and_the_snapshot_path_reads_it(
    ram: Path, stage: RamStage, tmp_path: Path
) -> None:
    dst = tmp_path / "mem"
    how = stage.copy(ram, dst)
    if how == "reflink":
        pytest.skip("this filesystem makes reflinks: nothing is staged")
    assert how == "staged"
    staged = stage.staged(dst)
    assert staged is not None and staged.parent == stage.root
    assert dst.read_bytes() == ram.read_bytes()
    assert allocated_bytes(staged) <= 4 * MIB  # holes stayed holes


def test_settle_puts_the_same_bytes_on_disk_and_frees_the_stage(
    ram: Path, stage: RamStage, tmp_path: Path
) -> None:
    dst = tmp_path / "mem"
    if stage.copy(ram, dst) != "staged":
        pytest.skip("nothing staged here")
    staged = stage.staged(dst)
    assert staged is not None
    assert stage.settle(dst)
    assert not dst.is_symlink() and not staged.exists()
    assert dst.read_bytes() == ram.read_bytes()
    assert allocated_bytes(dst) <= 4 * MIB
    assert not stage.settle(dst)  # a second settle has nothing to do
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_discard_frees_the_staged_copy(ram: Path, stage: RamStage, tmp_path: Path) -> None:
    dst = tmp_path / "mem"
    if stage.copy(ram, dst) != "staged":
        pytest.skip("nothing staged here")
    staged = stage.staged(dst)
    assert staged is not None
    stage.discard(dst)
    assert not staged.exists()


def test_without_a_stage_the_copy_goes_to_disk(ram: Path, tmp_path: Path) -> None:
    dst = tmp_path / "mem"
    assert RamStage(None).copy(ram, dst) in ("sparse", "reflink")
    assert not dst.is_symlink()
    assert dst.read_bytes() == ram.read_bytes()


def test_a_stage_that_fails_falls_back_to_disk(ram: Path, stage: RamStage, tmp_path: Path) -> None:
    assert stage.root is not None
    stage.close()  # the directory is gone: writing the staged copy fails
    dst = tmp_path / "mem"
    assert stage.copy(ram, dst) in ("sparse", "reflink")
    assert not dst.is_symlink()
    assert dst.read_bytes() == ram.read_bytes()


def test_reset_drops_what_an_earlier_run_staged(ram: Path, stage: RamStage, tmp_path: Path) -> None:
    if stage.copy(ram, tmp_path / "mem") != "staged":
        pytest.skip("nothing staged here")
    assert stage.root is not None and os.listdir(stage.root)
    stage.reset()
    assert os.listdir(stage.root) == []


def test_each_state_dir_has_its_own_stage(tmp_path: Path) -> None:
    a = RamStage.for_state(tmp_path / "a", shm=tmp_path)
    b = RamStage.for_state(tmp_path / "b", shm=tmp_path)
    assert a.root is not None and b.root is not None and a.root != b.root
    assert RamStage.for_state(tmp_path / "a", shm=tmp_path / "missing").root is None


def test_a_link_that_is_not_ours_is_left_alone(stage: RamStage, tmp_path: Path) -> None:
    other = tmp_path / "elsewhere"
    other.write_bytes(b"x")
    link = tmp_path / "mem"
    link.symlink_to(other)
    assert stage.staged(link) is None
    stage.discard(link)
    assert not stage.settle(link)
    assert other.exists()


def test_a_prepared_copy_has_the_extents_allocated_and_is_filled_in_place(
    ram: Path, stage: RamStage, tmp_path: Path
) -> None:
    prepared = stage.prepare(ram)
    if prepared is None:
        pytest.skip("nothing staged here")
    assert prepared.stat().st_size == ram.stat().st_size
    assert 3 * MIB <= allocated_bytes(prepared) <= 4 * MIB  # the data extents, not the holes
    assert prepared.read_bytes() == bytes(64 * MIB)  # allocated, not yet filled
    # the guest wrote a new page after the preparation: the copy still carries it
    with open(ram, "r+b") as f:
        f.seek(40 * MIB)
        f.write(b"late")
    dst = tmp_path / "mem"
    assert stage.copy(ram, dst, prepared) == "staged"
    assert stage.staged(dst) == prepared
    assert dst.read_bytes() == ram.read_bytes()


def test_a_prepared_copy_left_unused_is_released(ram: Path, stage: RamStage) -> None:
    prepared = stage.prepare(ram)
    if prepared is None:
        pytest.skip("nothing staged here")
    stage.release(prepared)
    assert not prepared.exists()
    stage.release(None)  # nothing prepared: nothing to do


def test_where_the_disk_makes_reflinks_nothing_is_staged(
    monkeypatch: pytest.MonkeyPatch, ram: Path, tmp_path: Path
) -> None:
    import workers.node.runtime.ramstage as ramstage

    monkeypatch.setattr(ramstage, "_makes_reflinks", lambda directory: True)
    (tmp_path / "state").mkdir()
    stage = RamStage.for_state(tmp_path / "state", shm=tmp_path)
    stage.reset()
    assert stage.root is None and stage.prepare(ram) is None
    assert stage.copy(ram, tmp_path / "mem") in ("sparse", "reflink")
