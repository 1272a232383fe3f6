"""What a create writes goes through the node's disk budget (issue 42), on real files with
a stand-in repository: a capture's pull reserves its blobs before it downloads (refused
`unavailable` when they cannot fit, nothing fetched), and is charged what it left — all it
reserved if it failed midway; a restore reserves its RAM file's allocated bytes."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from workers.node.disk import STATE, DiskUsage, scan
from workers.node.disk.budget import DiskBudget
from workers.node.disk.evictor import CacheEvictor
from workers.node.ports import HostError
from workers.node.runtime import Snapshot
from workers.node.runtime.diskroom import VM_EXTRA, restore_need
from workers.node.transfer import Transfers
from workers.node.vmm import Machine

MiB = 1 << 20


@dataclass(frozen=True)
class _Base:
    digest: str = "recipe"
    content: str | None = None


@dataclass(frozen=True)
class _Manifest:
    stored_bytes: int
    base_image: _Base = _Base()
    node_manifest: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Fetched:
    dir: Path
    blobs_fetched: int
    bytes_fetched: int


class _Repository:
    """Writes what a download writes: the capture's files, a layer, blobs in a cache."""

    def __init__(self, stored: int, cache: Path, *, fail: bool = False) -> None:
        self.manifest = _Manifest(stored)
        self.cache = cache
        self.fail = fail
        self.downloads = 0

    async def get_manifest(self, snapshot_id: str) -> _Manifest:
        return self.manifest

    async def download(
        self, key: str, dest_dir: Path, base_image_path: Path, *, layers_dir: Path, **_: object
    ) -> _Fetched:
        self.downloads += 1
        half = self.manifest.stored_bytes // 2
        self.cache.mkdir(parents=True, exist_ok=True)
        (self.cache / "blob").write_bytes(os.urandom(half))
        dest_dir.mkdir(parents=True, exist_ok=True)
        (dest_dir / "mem").write_bytes(os.urandom(half))
        if self.fail:
            raise OSError("the store went away")
        layers_dir.mkdir(parents=True, exist_ok=True)
        (layers_dir / f"{key}.qcow2").write_bytes(os.urandom(half))
        Snapshot(
            key,
            dest_dir,
            Machine("q", "tcg", "max", 1, 64, "02:00:00:00:00:01"),
            layers_dir / f"{key}.qcow2",
            base_image_path,
            base_image_path,
        ).write()
        return _Fetched(dest_dir, 1, half)


def _setup(tmp_path: Path, budget: int, repo_stored: int, *, fail: bool = False) -> Any:
    state = tmp_path / "state"
    base = tmp_path / "base.ext4"
    base.write_bytes(b"\0" * 4096)
    (state / "layers").mkdir(parents=True)
    ledger = DiskBudget(
        DiskUsage(state, None), budget, headroom=0, evictor=CacheEvictor(None, state)
    )
    ledger.walk()
    repo = _Repository(repo_stored, state / "blob-cache", fail=fail)
    runtime = SimpleNamespace(layers=SimpleNamespace(root=state / "layers"), disk_budget=ledger)
    transfers = Transfers(runtime, None, repo)  # type: ignore[arg-type]
    return state, base, ledger, repo, transfers


async def test_a_pull_that_cannot_fit_is_refused_unavailable_before_it_downloads(
    tmp_path: Path,
) -> None:
    state, base, ledger, repo, transfers = _setup(tmp_path, 8 * MiB, 6 * MiB)
    with pytest.raises(HostError, match="could not be fetched: node disk budget") as refused:
        await transfers.fetch("snap1", state / "snapshots" / "snap1", base, "the capture")
    assert refused.value.code == "unavailable"
    assert repo.downloads == 0 and ledger.reserved() == 0


async def test_a_pull_is_charged_what_it_wrote(tmp_path: Path) -> None:
    state, base, ledger, _repo, transfers = _setup(tmp_path, 64 * MiB, 6 * MiB)
    snap = await transfers.fetch("snap1", state / "snapshots" / "snap1", base, "the capture")
    assert snap.snapshot_id == "snap1"
    assert ledger.reserved() == 0
    assert ledger.used() >= scan([(STATE, state)]).total  # the ledger errs high, never low


async def test_a_pull_that_failed_midway_is_charged_all_it_reserved(tmp_path: Path) -> None:
    state, base, ledger, _repo, transfers = _setup(tmp_path, 64 * MiB, 6 * MiB, fail=True)
    before = ledger.used()
    with pytest.raises(HostError, match="could not be fetched"):
        await transfers.fetch("snap1", state / "snapshots" / "snap1", base, "the capture")
    assert ledger.reserved() == 0
    assert ledger.used() >= before + 2 * 6 * MiB
    assert ledger.used() >= scan([(STATE, state)]).total


def test_a_restore_reserves_its_ram_file_unless_it_maps_the_captures(tmp_path: Path) -> None:
    mem = tmp_path / "mem"
    with open(mem, "wb") as f:
        f.truncate(64 * MiB)
        f.write(os.urandom(3 * MiB))
    snap = SimpleNamespace(mem=mem, state=tmp_path / "state", ram_in_state=False)
    own = restore_need(snap, private=False)  # type: ignore[arg-type]
    assert own == VM_EXTRA + os.stat(mem).st_blocks * 512 and own >= VM_EXTRA + 3 * MiB
    assert restore_need(snap, private=True) == VM_EXTRA  # type: ignore[arg-type]
    gone = SimpleNamespace(mem=tmp_path / "nothing", state=tmp_path / "x", ram_in_state=False)
    assert restore_need(gone, private=False) == VM_EXTRA  # type: ignore[arg-type]
