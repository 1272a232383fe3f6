"""A failed import leaves nothing (issue 42, images-at-scale S8), for real: a registry on
loopback, skopeo, the unpacker and mkfs. An earlier good import shares the failing image's
base layer; the failing image adds a layer of its own and then a last layer cut at 90 % of
its bytes, one of two ways a puller really meets:

- `stream`: the blob is the cut gzip stream itself (its digest is of those bytes, so the
  registry and skopeo take it), while the config's diff_id is of the whole tar: the pull
  succeeds, the unpack fails at the last layer after the layer before it was kept as a chain;
- `registry`: a good image is pushed, then the registry's stored blob is cut short: skopeo
  fails on the digest while downloading.

Either way `du` of the image cache and the state dir is what it was (±1 MiB), the earlier
image's chains and blobs are all there, and a new image on the same base starts from its
chain. No VM: an import stops at the guest image."""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.registry import (
    MACHINE_CACHE,
    LocalRegistry,
    busybox_tree,
    import_registry,
    own_image_cache,
    push,
)
from workers.node.disk.categories import IMAGES, STATE
from workers.node.disk.usage import scan
from workers.node.image import cache
from workers.node.image.errors import ImageError
from workers.node.image.oci_write import tar_tree, write_layout
from workers.node.imports import convert_image, import_image
from workers.node.ports import HostError, ImageSource

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

#: the machine's image cache: its kernel is lent (hard links) so nothing is downloaded
FREE = 64 << 20  # a small root disk: the test is about what stays behind, not size
MiB = 1 << 20


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[LocalRegistry]:
    yield from import_registry(tmp_path)


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty image cache but for the machine's unpacked kernel; `convert_image` builds
    in it."""
    root = own_image_cache(tmp_path / "images")
    monkeypatch.setenv(cache.CACHE_ENV, str(root))
    return root


def _du(path: Path) -> int:
    out = subprocess.run(["du", "-sB1", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def _names(d: Path) -> set[str]:
    return {p.name for p in d.iterdir()} if d.is_dir() else set()


def _top(tmp: Path, name: str, size: int) -> bytes:
    """A gzip layer of one `size`-byte file that does not compress (so its blob is big)."""
    tree = tmp / name
    (tree / "data").mkdir(parents=True)
    (tree / "data" / name).write_bytes(os.urandom(size))
    return tar_tree(tree)


def _import(name: str, ref: str, messages: list[str] | None = None) -> None:
    tell = messages.append if messages is not None else None
    convert_image(name, ImageSource(ref=ref), tell, free_bytes=FREE)


@pytest.mark.parametrize("cut", ["stream", "registry"])
def test_a_failed_import_leaves_the_cache_as_it_was(
    cut: str, registry: LocalRegistry, root: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state"  # the node's state dir: an import writes nothing there
    state.mkdir()
    base = tar_tree(busybox_tree(tmp_path / "base"))
    good = write_layout(tmp_path / "good", [base, _top(tmp_path, "good", MiB)])
    assert good
    _import("good", push(tmp_path / "good", registry, "t/good"))
    before = {"cache": _du(root), "state": _du(state)}
    by_category = scan([(IMAGES, root), (STATE, state)]).bytes
    blobs, chains = _names(root / "blobs" / "sha256"), _names(root / "layers")
    layouts = _names(root / "oci")
    # a finished import keeps its base layer (blob and chain) for the next image on that
    # base, and drops its layout, its own layer's blob and its whole-stack chain
    assert len(chains) == 1 and not layouts
    assert len(blobs) == 1

    mid = _top(tmp_path, "mid", 8 * MiB)  # unpacked and kept as a chain before the failure
    last = _top(tmp_path, "last", 16 * MiB)
    if cut == "stream":
        diff_ids = [
            "sha256:" + hashlib.sha256(gzip.decompress(b)).hexdigest() for b in (base, mid, last)
        ]
        write_layout(
            tmp_path / "bad",
            [base, mid, last[: len(last) * 9 // 10]],
            config={"rootfs": {"type": "layers", "diff_ids": diff_ids}},
        )
        ref = push(tmp_path / "bad", registry, "t/bad")
    else:
        write_layout(tmp_path / "bad", [base, mid, last])
        ref = push(tmp_path / "bad", registry, "t/bad")
        hexd = hashlib.sha256(last).hexdigest()
        stored = (
            tmp_path / "registry/data/docker/registry/v2/blobs/sha256" / hexd[:2] / hexd / "data"
        )
        stored.write_bytes(last[: len(last) * 9 // 10])
    with pytest.raises(ImageError) as failed:
        _import("bad", ref)
    assert "node disk full" not in str(failed.value)
    if cut == "stream":
        assert "corrupt gzip stream" in str(failed.value), failed.value

    after = {"cache": _du(root), "state": _du(state)}
    for where, size in before.items():
        assert abs(after[where] - size) <= MiB, (where, size, after[where], failed.value)
    # the node's own accounting (S7) agrees, category by category (oci_blob, chain, ...)
    for category, size in scan([(IMAGES, root), (STATE, state)]).bytes.items():
        assert abs(size - by_category[category]) <= MiB, (category, size, by_category[category])
    assert _names(root / "blobs" / "sha256") == blobs  # the shared base's blob too
    assert _names(root / "layers") == chains
    assert _names(root / "oci") == layouts
    assert not list(root.glob(".tmp-*")) and not list((root / "layers").glob(".tmp-*"))

    # the earlier image's chains are usable: an image on the same base starts from them
    messages: list[str] = []
    write_layout(tmp_path / "next", [base, _top(tmp_path, "next", MiB)])
    _import("next", push(tmp_path / "next", registry, "t/next"), messages)
    assert any("layers 0-0 already unpacked" in m for m in messages), messages
    assert (root / "names" / "tpl-good" / cache.MANIFEST).is_file()


@pytest.fixture
def small_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An image cache on a 40 MiB tmpfs of its own: room for the pull, not the unpack."""
    root = tmp_path / "small"
    root.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(root)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    try:
        shutil.copy(MACHINE_CACHE / "kernel-resolved.json", root / "kernel-resolved.json")
        monkeypatch.setenv(cache.CACHE_ENV, str(root))
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


async def test_a_full_disk_is_unavailable_and_leaves_nothing(
    registry: LocalRegistry, small_root: Path, tmp_path: Path
) -> None:
    """ENOSPC while importing: `HostError` with code `unavailable` (another node with room
    can take it) whose message names the disk, and the same cleanup."""
    if not (MACHINE_CACHE / "kernel-resolved.json").is_file():
        pytest.skip("no resolved kernel in this machine's image cache")
    base = tar_tree(busybox_tree(tmp_path / "base"))
    write_layout(
        tmp_path / "big", [base, _top(tmp_path, "mid", 12 * MiB), _top(tmp_path, "top", 12 * MiB)]
    )
    ref = push(tmp_path / "big", registry, "t/big")
    before = _du(small_root)
    with pytest.raises(HostError) as failed:
        await import_image("big", ImageSource(ref=ref), None, free_bytes=FREE)
    assert failed.value.code == "unavailable"
    message = str(failed.value)  # the disk (the cache's path) and the step that filled it
    assert message.startswith("node disk full: ") and f" in {small_root}: " in message
    assert "No space left on device" in message
    assert abs(_du(small_root) - before) <= MiB
    assert not list(small_root.glob("blobs/sha256/*")) and not list(small_root.glob("layers/*"))
    assert not list(small_root.glob("oci/*")) and not list(small_root.glob(".tmp-*"))
