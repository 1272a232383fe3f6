"""Layers share blocks (issue 29), for real: a registry on loopback, skopeo, the unpacker,
mkfs and debugfs. Two images on one base are imported into one node's cache: `p` is the
base alone, `c` the base and a layer of its own (a new directory of files, one base file
replaced, one whited out). `c`'s root disk is derived from the base chain's
(`workers/node/image/layerdisk.py`), so its 4 MiB chunks are `p`'s but for what its layer
and the guest injection wrote; the files of its layer read back from the disk byte for
byte (`debugfs rdump`); the base's gone file is gone. No VM: an import stops at the disk.

Scale form (`make test-scale`): `AENV_LAYER_BLOCKS_BASE_MIB=400 AENV_LAYER_BLOCKS_CHILD_MIB=50`.
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.diskdigest import CHUNK_SIZE, chunk_list
from tests.registry import LocalRegistry, import_registry, own_image_cache, push
from workers.node.image import cache
from workers.node.image.oci_write import tar_tree, write_layout
from workers.node.imports import convert_image
from workers.node.ports import ImageSource

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

MiB = 1 << 20
BASE_MIB = int(os.environ.get("AENV_LAYER_BLOCKS_BASE_MIB", "48"))
CHILD_MIB = int(os.environ.get("AENV_LAYER_BLOCKS_CHILD_MIB", "8"))
FREE = 256 << 20
#: chunks a layer may touch beyond its own data: the superblock's and group descriptors',
#: the bitmaps' and inode tables', and the one its data starts in (the base's last)
EXTRA_CHUNKS = 3


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[LocalRegistry]:
    yield from import_registry(tmp_path)


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = own_image_cache(tmp_path / "images")
    monkeypatch.setenv(cache.CACHE_ENV, str(root))
    monkeypatch.delenv("AENV_LAYERED_DISKS", raising=False)
    return root


def _fill(root: Path, mib: int, dirs: int, rnd: random.Random) -> list[Path]:
    """`mib` MiB of random files (sizes spread like a distribution's) in `dirs` dirs."""
    made, left = [], mib * MiB
    places = [root / f"d{i:03d}" / f"s{i % 5}" for i in range(dirs)]
    for p in places:
        p.mkdir(parents=True, exist_ok=True)
    while left > 0:
        size = min(left, int(rnd.lognormvariate(9.5, 1.6)) + 1)
        f = rnd.choice(places) / f"f{len(made)}"
        f.write_bytes(rnd.randbytes(size))
        made.append(f)
        left -= size
    return made


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_two_images_on_one_base_share_all_but_the_layers_chunks(
    registry: LocalRegistry, root: Path, tmp_path: Path
) -> None:
    rnd = random.Random(29)
    base = tmp_path / "base"
    files = _fill(base / "usr", BASE_MIB, max(8, BASE_MIB // 3), rnd)
    (base / "etc").mkdir()
    (base / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    child = tmp_path / "child"
    _fill(child / "opt/app", CHILD_MIB, 8, rnd)
    replaced, gone = files[len(files) // 3], files[2 * len(files) // 3]
    for p in (replaced, gone):
        (child / p.parent.relative_to(base)).mkdir(parents=True, exist_ok=True)
    (child / replaced.relative_to(base)).write_bytes(rnd.randbytes(100_000))
    (child / gone.parent.relative_to(base) / f".wh.{gone.name}").write_bytes(b"")
    lower, own = tar_tree(base), tar_tree(child)
    write_layout(tmp_path / "p", [lower])
    write_layout(tmp_path / "c", [lower, own])
    layer_bytes = len(tar_tree(child, compress=False))
    refs = {n: push(tmp_path / n, registry, f"t/{n}") for n in ("p", "c")}

    images, seconds = {}, {}
    for name in ("p", "c"):
        t0 = time.monotonic()
        images[name] = convert_image(name, ImageSource(ref=refs[name]), None, free_bytes=FREE)
        seconds[name] = round(time.monotonic() - t0, 1)
    made = images["c"].manifest["rootfs"]["made"]
    assert made["from"] == "layers", made
    p, c = (chunk_list(images[n].rootfs) for n in ("p", "c"))
    ours = {h for h in p.chunks if h}
    new = [i for i, h in enumerate(c.chunks) if h and h not in ours]
    layer_chunks = -(-layer_bytes // CHUNK_SIZE)
    print(
        f"\nlayer blocks: base {BASE_MIB} MiB, layer {layer_bytes / MiB:.1f} MiB "
        f"({layer_chunks} chunks); p {len(ours)} chunks, c {sum(1 for h in c.chunks if h)}; "
        f"c's not in p: {len(new)} ({len(new) * 4} MiB) at {new}; imports {seconds}; {made}"
    )
    assert len(new) <= layer_chunks + EXTRA_CHUNKS, new

    # what the guest would read: the layer's files, byte for byte, from c's disk
    dump = tmp_path / "dump"
    dump.mkdir()
    for where in ("/opt", "/" + str(replaced.parent.relative_to(base))):
        out = dump / where.strip("/").replace("/", "_")
        out.mkdir()
        proc = subprocess.run(
            ["debugfs", "-R", f"rdump {where} {out}", str(images["c"].rootfs)],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr
    for f in (child / "opt").rglob("*"):
        if f.is_file():
            assert _sha(dump / "opt" / f.relative_to(child)) == _sha(f), f
    in_dump = dump / str(replaced.parent.relative_to(base)).replace("/", "_")
    in_dump = in_dump / replaced.parent.name
    assert _sha(in_dump / replaced.name) == _sha(child / replaced.relative_to(base))
    assert not (in_dump / gone.name).exists() or gone.parent != replaced.parent
    ls = subprocess.run(
        ["debugfs", "-R", f"ls /{gone.relative_to(base).parent}", str(images["c"].rootfs)],
        capture_output=True,
        text=True,
    ).stdout
    assert gone.name not in ls.split() and len(ls.split()) > 2
