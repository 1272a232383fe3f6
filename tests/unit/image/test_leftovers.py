"""A failed import leaves nothing (`leftovers.py`): the pure decision (what it made, minus
what another image holds), the disk-full test, and the ledger filled by a real unpack
that fails on a layer cut short, in a cache on tmp_path."""

from __future__ import annotations

import errno
import fcntl
import gzip
import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from workers.node.image.errors import DiskFull, ImageError
from workers.node.image.leftovers import (
    Held,
    Made,
    blob_file,
    disk_full,
    finish_interrupted,
    finished,
    forget_on_failure,
    held_by_others,
    in_use_by_others,
    leftovers,
    remove,
)
from workers.node.image.oci import open_layout, unpack
from workers.node.image.oci_chains import chain_dir, chain_ids
from workers.node.image.oci_write import write_layout

from .test_oci import f, layer


def test_a_finished_import_keeps_its_lower_layers_and_drops_the_rest() -> None:
    made = Made(
        blobs={"sha256:manifest", "sha256:config", "sha256:base", "sha256:mid", "sha256:top"},
        chains={"sha256:c1", "sha256:c2"},  # c0 (the base's chain) was there before
        layouts={Path("/c/oci/mine")},
    )
    layers = ["sha256:base", "sha256:mid", "sha256:top"]
    chains = ["sha256:c0", "sha256:c1", "sha256:c2"]
    plan = finished(made, layers, chains, Held())
    assert plan.blobs == {"sha256:manifest", "sha256:config", "sha256:top"}
    assert plan.chains == {"sha256:c2"}  # the whole stack's: only these bytes would reuse it
    assert plan.layouts == {Path("/c/oci/mine")}
    # what another image holds stays; a whole-stack chain made before this import stays
    held = Held(blobs=frozenset({"sha256:top"}), chains=frozenset())
    assert finished(made, layers, chains, held).blobs == {"sha256:manifest", "sha256:config"}
    assert finished(Made(chains={"sha256:c1"}), layers, chains, Held()).chains == set()
    # one layer: its blob and its chain are the top's
    one = finished(
        Made(blobs={"sha256:only"}, chains={"sha256:k"}), ["sha256:only"], ["sha256:k"], Held()
    )
    assert one.blobs == {"sha256:only"} and one.chains == {"sha256:k"}


def test_what_it_made_goes_unless_another_image_holds_it() -> None:
    made = Made(
        blobs={"sha256:base", "sha256:mine"},
        chains={"sha256:c0", "sha256:c1"},
        layouts={Path("/c/oci/mine")},
    )
    held = Held(blobs=frozenset({"sha256:base", "sha256:other"}), chains=frozenset({"sha256:c0"}))
    plan = leftovers(made, held)
    assert plan.blobs == {"sha256:mine"}  # never one it did not make ("other")
    assert plan.chains == {"sha256:c1"}
    assert plan.layouts == {Path("/c/oci/mine")}  # its own layout always goes


def test_nothing_made_nothing_removed() -> None:
    assert leftovers(Made(), Held(frozenset({"sha256:x"}), frozenset({"sha256:y"}))) == Made()


def test_a_full_disk_is_seen_through_causes_and_tool_messages() -> None:
    assert disk_full(OSError(errno.ENOSPC, "No space left on device"))
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as e:
            raise ImageError("layer 1: cannot write usr/lib/big") from e
    except ImageError as wrapped:
        assert disk_full(wrapped)
    assert disk_full(ImageError("pull x: writing blob: write /c/blobs: no space left on device"))
    assert not disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not disk_full(ImageError("layer 1: corrupt gzip stream"))


def _cache_with_other_layout(root: Path) -> tuple[str, str]:
    """A cache where a finished import's layout (`oci/other`) names a blob and, by its
    config's diff_ids, a chain; returns (that blob's digest, that chain id)."""
    blobs = root / "blobs"
    base = layer(f("etc/base", b"base"))
    plain = gzip.decompress(base)
    lay = root / "oci" / "other"
    write_layout(lay, [base])
    for p in (lay / "blobs" / "sha256").iterdir():  # as skopeo's shared blob dir holds them
        (blobs / "sha256").mkdir(parents=True, exist_ok=True)
        p.rename(blobs / "sha256" / p.name)
    digest = "sha256:" + hashlib.sha256(base).hexdigest()
    return digest, chain_ids(["sha256:" + hashlib.sha256(plain).hexdigest()])[0]


def test_held_by_others_reads_every_other_layout(tmp_path: Path) -> None:
    blob, chain = _cache_with_other_layout(tmp_path)
    held = held_by_others(tmp_path, mine=set())
    assert blob in held.blobs and held.chains == {chain}
    assert held_by_others(tmp_path, mine={tmp_path / "oci" / "other"}) == Held()
    (tmp_path / "oci" / "broken").mkdir()  # mid-pull: no index.json yet, holds nothing
    assert held_by_others(tmp_path, mine=set()) == held


def _touch(path: Path, data: bytes = b"x") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_a_failure_removes_what_it_made_minus_what_others_hold(tmp_path: Path) -> None:
    shared, shared_chain = _cache_with_other_layout(tmp_path)
    mine = tmp_path / "oci" / "mine"
    with pytest.raises(ImageError, match="corrupt"), forget_on_failure(tmp_path, "x") as made:
        _touch(mine / "index.json", b"{}")
        made.layouts.add(mine)
        _touch(blob_file(tmp_path / "blobs", "sha256:" + "a" * 64))
        made.blobs |= {"sha256:" + "a" * 64, shared}  # `shared` was made by both at once
        _touch(chain_dir(tmp_path / "layers", shared_chain) / "ok")
        _touch(chain_dir(tmp_path / "layers", "sha256:" + "b" * 64) / "ok")
        made.chains |= {shared_chain, "sha256:" + "b" * 64}
        raise ImageError("layer 1: corrupt gzip stream")
    assert not mine.exists()
    assert not blob_file(tmp_path / "blobs", "sha256:" + "a" * 64).exists()
    assert not chain_dir(tmp_path / "layers", "sha256:" + "b" * 64).exists()
    assert blob_file(tmp_path / "blobs", shared).is_file()  # held by oci/other
    assert chain_dir(tmp_path / "layers", shared_chain).is_dir()


def test_a_success_keeps_everything(tmp_path: Path) -> None:
    with forget_on_failure(tmp_path, "x") as made:
        _touch(tmp_path / "oci" / "mine" / "index.json")
        made.layouts.add(tmp_path / "oci" / "mine")
    assert (tmp_path / "oci" / "mine" / "index.json").is_file()


def test_enospc_is_disk_full_naming_the_step(tmp_path: Path) -> None:
    full = pytest.raises(DiskFull, match=r"^node disk full: import of r: .*space")
    with full, forget_on_failure(tmp_path, "import of r"):
        raise OSError(errno.ENOSPC, "No space left on device")
    # a tool's failure reaches us as text (mkfs.ext4's stderr, say)
    proc = subprocess.CompletedProcess(["mkfs.ext4"], 1, "", "No space left on device")
    with pytest.raises(DiskFull), forget_on_failure(tmp_path, "build"):
        raise ImageError(f"mkfs.ext4 failed: {proc.stderr}")


def test_unpack_tells_the_ledger_each_chain_it_kept(tmp_path: Path) -> None:
    """A layer cut short at 90 % of its bytes (its blob digest is of the cut bytes, so
    it verifies; the gzip stream ends early): the chains kept before it are in the
    ledger, and a chain that was there before is not."""
    good = [layer(f(f"etc/l{i}", bytes([i]) * 4096)) for i in range(2)]
    full = layer(f("usr/big", hashlib.sha256(b"x").digest() * 4096))
    cut = full[: len(full) * 9 // 10]
    diff_ids = ["sha256:" + hashlib.sha256(gzip.decompress(b)).hexdigest() for b in [*good, full]]
    write_layout(tmp_path / "lay", [*good, cut], config={"rootfs": {"diff_ids": diff_ids}})
    cache = tmp_path / "layers"
    chains = chain_ids(diff_ids)
    _touch(chain_dir(cache, chains[0]) / "ok")  # layer 0: an earlier import kept it
    (chain_dir(cache, chains[0]) / "tree" / "etc").mkdir(parents=True)
    made = Made()
    with open_layout(tmp_path / "lay") as lo, pytest.raises(ImageError, match="corrupt gzip"):
        unpack(lo, tmp_path / "dest", progress=lambda _: None, cache=cache, made=made)
    assert made.chains == {chains[1]}
    assert (chain_dir(cache, chains[1]) / "ok").is_file()


def test_what_a_running_import_uses_stays_when_another_fails(tmp_path: Path) -> None:
    """Two imports in this node at once share a new layer: the one still running (its
    layout not complete yet) keeps the blob and chain the failing one made."""
    shared, chain = "sha256:" + "c" * 64, "sha256:" + "d" * 64
    with forget_on_failure(tmp_path, "other") as other:
        other.use(blobs=[shared], chains=[chain])
        with pytest.raises(ImageError), forget_on_failure(tmp_path, "mine") as made:
            _touch(blob_file(tmp_path / "blobs", shared))
            _touch(chain_dir(tmp_path / "layers", chain) / "ok")
            made.blobs.add(shared)
            made.chains.add(chain)
            raise ImageError("layer 2: corrupt gzip stream")
        assert blob_file(tmp_path / "blobs", shared).is_file()
        assert chain_dir(tmp_path / "layers", chain).is_dir()
    assert in_use_by_others(Made()) == Held()  # both are done: nothing is in use


def _plan(root: Path, name: str, blobs: list[str], chains: list[str], layouts: list[Path]) -> Path:
    """A removal's plan in `.tidy/`, as `remove` writes it before it starts."""
    doc = {"blobs": blobs, "chains": chains, "layouts": [str(p) for p in layouts]}
    _touch(root / ".tidy" / name, json.dumps(doc).encode())
    return root / ".tidy" / name


def test_a_removal_cut_short_is_finished_by_the_next_start(tmp_path: Path) -> None:
    """A plan nobody holds locked (its remover was killed): the rest of it goes, minus
    what another layout holds by now; a locked one (its remover alive) is left alone."""
    shared, _ = _cache_with_other_layout(tmp_path)
    mine, live = "sha256:" + "a" * 64, "sha256:" + "e" * 64
    for digest in (mine, live):
        _touch(blob_file(tmp_path / "blobs", digest))
    chain = "sha256:" + "b" * 64
    _touch(chain_dir(tmp_path / "layers", chain) / "tree" / "half-removed")
    layout = tmp_path / "oci" / "mine"
    _touch(layout / "index.json", b"{}")
    cut = _plan(tmp_path, "1-cut.json", [mine, shared], [chain], [layout])
    running = _plan(tmp_path, "2-running.json", [live], [], [])
    _touch(tmp_path / ".tidy" / "3-unrenamed.tmp")  # killed before its plan was in place
    with running.open() as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # its remover, alive
        assert finish_interrupted(tmp_path) == 1
    assert not blob_file(tmp_path / "blobs", mine).exists()
    assert blob_file(tmp_path / "blobs", shared).is_file()  # oci/other names it
    assert not chain_dir(tmp_path / "layers", chain).exists() and not layout.exists()
    assert not cut.exists() and running.is_file()
    assert blob_file(tmp_path / "blobs", live).is_file()
    assert sorted(p.name for p in (tmp_path / ".tidy").iterdir()) == ["2-running.json"]
    # its remover died since: the next import finishes it before it starts
    with forget_on_failure(tmp_path, "next"):
        assert not blob_file(tmp_path / "blobs", live).exists()
    assert not running.exists()


def test_a_removal_that_ends_leaves_no_plan(tmp_path: Path) -> None:
    digest = "sha256:" + "f" * 64
    _touch(blob_file(tmp_path / "blobs", digest))
    remove(tmp_path, Made(blobs={digest}))
    assert not blob_file(tmp_path / "blobs", digest).exists()
    assert list((tmp_path / ".tidy").iterdir()) == []


def test_an_attempt_keeps_a_record_of_what_it_made_while_it_runs(tmp_path: Path) -> None:
    """Killed mid-import, the attempt's record names what it made and what it was about to
    make; a line torn by the kill is skipped. Ended, the record goes."""
    made_blob, coming = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    with forget_on_failure(tmp_path, "import") as made:
        _touch(blob_file(tmp_path / "blobs", made_blob))
        made.expect(blobs=[made_blob, coming])  # a pull's new blobs, before skopeo
        made.wrote(blobs=[made_blob])
        [record] = (tmp_path / ".tidy").glob("*.json")
        lines = record.read_text().splitlines()
        assert len(lines) == 2 and made.blobs == {made_blob}
        # as a kill would leave it: the same lines, a torn one, no lock
        _plan(tmp_path, "9-killed.json", [], [], [])
        (tmp_path / ".tidy" / "9-killed.json").write_text("\n".join([*lines, '{"blobs": ["sha']))
    assert list((tmp_path / ".tidy").glob("*.json")) == [tmp_path / ".tidy" / "9-killed.json"]
    assert finish_interrupted(tmp_path) == 1
    assert not blob_file(tmp_path / "blobs", made_blob).exists()
    assert list((tmp_path / ".tidy").iterdir()) == []
