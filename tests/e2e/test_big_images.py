"""Issue 40: a registry image of any size is a sandbox with room to work. A Debian layer
plus one large-file layer (made here, pushed to a `docker-registry` on loopback) is
imported through the unchanged e2b SDK (`Template.build(from_image)`) and started; in the
guest `df /` shows at least 8 GiB free, and on the host the root disk's allocation (`du`,
not its size) is at most the image's bytes + 5 % + 100 MiB.

The CI run imports a 512 MiB image: the same path (pull, unpack, a root disk sized for the
content plus the free room, sparse on the host) and the same checks, in a fifth of the
time (the layout, push and import grow with the bytes). `AENV_TEST_SCALE=1`
(`make test-scale`) imports the issue's 2.3 GiB image (refused before: "disk size 2048 MiB
is too small") and a 6 GiB one instead. Each test checks the host's free disk first and
deletes what it made: the template, its image and the node's pulled blobs and unpacked
layers of it."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from e2b import Sandbox, Template

from tests.e2e.conftest import Stack
from tests.registry import (
    debian_tree,
    layout,
    layout_with_big_file,
    local_registry,
    pattern_block,
    push,
)
from workers.node.image.cache import cache_root
from workers.node.image.oci_chains import chain_dir, chain_ids
from workers.node.image.registry import parse_reference

pytestmark = [pytest.mark.vm, pytest.mark.timeout(1800)]

GiB = 1 << 30
MiB = 1 << 20
SCALE = os.environ.get("AENV_TEST_SCALE", "") not in ("", "0")
SIZES = [int(2.3 * GiB), 6 * GiB] if SCALE else [512 * MiB]
#: what the issue asks of every root disk: this much free in the guest
FREE = 8 * GiB
#: room left on the host beyond what the test makes (the issue's rule for big-image tests)
MARGIN = 20 * 10**9
PROGRAMS = ("bash", "df", "head", "sha256sum", "stat", "tail", "cat")
BIG = "/data/big.bin"


def _image_dir(logs: list[str]) -> Path | None:
    for line in logs:
        if m := re.search(r"image [0-9a-f]{64} ready in (\S+)", line):
            return Path(m.group(1))
    return None


def _forget(cache: Path, ref: str, layout: dict[str, object], image: Path | None) -> None:
    """Delete what the import of `ref` left in the node's cache: its image, the layout of
    the pull, the blobs and the unpacked chains (named by this test's unique layers)."""
    if image is not None:
        for link in (cache / "names").iterdir():
            if link.is_symlink() and link.resolve() == image.resolve():
                link.unlink()
        shutil.rmtree(image, ignore_errors=True)
    key = hashlib.sha256(str(parse_reference(ref)).encode()).hexdigest()[:32]
    shutil.rmtree(cache / "oci" / key, ignore_errors=True)
    for digest in layout["blobs"]:  # type: ignore[attr-defined]
        (cache / "blobs" / "sha256" / digest.split(":", 1)[1]).unlink(missing_ok=True)
    for chain in chain_ids(layout["diff_ids"]):  # type: ignore[arg-type]
        shutil.rmtree(chain_dir(cache / "layers", chain), ignore_errors=True)


def _read_layout(path: Path) -> dict[str, object]:
    index = json.loads((path / "index.json").read_text())
    digest = index["manifests"][0]["digest"]
    manifest = json.loads((path / "blobs/sha256" / digest.split(":", 1)[1]).read_text())
    config = json.loads(
        (path / "blobs/sha256" / manifest["config"]["digest"].split(":", 1)[1]).read_text()
    )
    blobs = [digest, manifest["config"]["digest"], *(d["digest"] for d in manifest["layers"])]
    return {"blobs": blobs, "diff_ids": config["rootfs"]["diff_ids"]}


@contextmanager
def _imported(ref: str, layout: dict[str, object], **build: int) -> Iterator[tuple[str, Path]]:
    """`ref` built as a template through the SDK: (its name, its image dir on this host);
    the template and what the import left in the node's cache deleted after."""
    name = f"big-{uuid.uuid4().hex[:8]}"
    logs: list[str] = []
    try:
        Template.build(
            Template().from_image(ref),
            name,
            on_build_logs=lambda e: logs.append(e.message),
            **build,  # type: ignore[arg-type]
        )
        image = _image_dir(logs)
        assert image is not None, logs
        yield name, image
    finally:
        try:
            Sandbox.delete_snapshot(name)
        finally:
            _forget(cache_root(None), ref, layout, _image_dir(logs))


def _room(where: list[Path], need: int) -> None:
    for p in where:
        free = shutil.disk_usage(p).free
        if free < need:
            pytest.skip(f"{p}: {free / GiB:.1f} GiB free, the test needs {need / GiB:.1f}")


def _df_avail(sbx: Sandbox) -> int:
    return int(sbx.commands.run("df -B1 --output=avail / | tail -n 1").stdout)


@pytest.mark.parametrize("size", SIZES, ids=lambda n: f"{n / GiB:.1f}GiB")
def test_a_big_registry_image_is_a_sandbox_with_room(
    stack: Stack, tmp_path: Path, size: int
) -> None:
    # the stack's node runs on this host, on this cache: the unpacked layer chain and the
    # root disk, then the margin
    _room([cache_root(None), tmp_path], 2 * size + MARGIN)
    seed = uuid.uuid4().hex
    base = debian_tree(tmp_path / "base", *PROGRAMS)
    (base / "etc/aenv-test-seed").write_text(seed + "\n")  # layers no other image shares
    t0 = time.monotonic()
    with local_registry(tmp_path / "registry") as registry:
        base_bytes = sum(p.stat().st_size for p in base.rglob("*") if p.is_file())
        out, image_bytes = layout_with_big_file(
            tmp_path / "img", base, BIG, size - base_bytes, seed.encode()
        )
        layout = _read_layout(out)
        ref = push(out, registry, "scale/big", seed[:8])
        shutil.rmtree(out)
        made = time.monotonic() - t0
        with _imported(ref, layout) as (name, image):
            built = time.monotonic() - t0 - made
            sbx = Sandbox.create(name)
            try:
                run = sbx.commands.run
                avail = _df_avail(sbx)
                assert avail >= FREE, f"{avail / GiB:.2f} GiB free in the guest"
                assert int(run(f"stat -c %s {BIG}").stdout) == size - base_bytes
                head = hashlib.sha256(pattern_block(seed.encode()) * 2).hexdigest()
                assert run(f"head -c 8192 {BIG} | sha256sum").stdout.split()[0] == head
                assert run("cat /etc/aenv-test-seed").stdout == seed + "\n"
            finally:
                sbx.kill()
            disk = image / "root.ext4"
            allocated = disk.stat().st_blocks * 512
            print(
                f"\n{size / GiB:.1f} GiB image ({image_bytes / MiB:.0f} MiB of tars): "
                f"layout+push {made:.0f} s, import {built:.0f} s, root disk "
                f"{disk.stat().st_size / GiB:.2f} GiB, allocated {allocated / MiB:.0f} MiB, "
                f"{avail / GiB:.2f} GiB free in the guest"
            )
            assert allocated <= image_bytes * 1.05 + 100 * MiB
    shutil.rmtree(tmp_path / "registry", ignore_errors=True)


def test_a_template_asks_for_its_own_free_disk(stack: Stack, tmp_path: Path) -> None:
    """A build's `minFreeDiskMb` (the SDK's `min_free_disk_mb`) sizes the image's root
    disk: 12 GiB free in the guest instead of the node's 8; sparse, so it costs nothing."""
    _room([cache_root(None)], MARGIN)
    seed = uuid.uuid4().hex
    base = debian_tree(tmp_path / "base", *PROGRAMS)
    (base / "etc/aenv-test-seed").write_text(seed + "\n")
    with local_registry(tmp_path / "registry") as registry:
        out = layout(tmp_path / "img", base)
        ref = push(out, registry, "scale/roomy", seed[:8])
        with _imported(ref, _read_layout(out), min_free_disk_mb=12 << 10) as (name, image):
            sbx = Sandbox.create(name)
            try:
                avail = _df_avail(sbx)
            finally:
                sbx.kill()
            assert avail >= 12 * GiB, f"{avail / GiB:.2f} GiB free in the guest"
            assert (image / "root.ext4").stat().st_blocks * 512 < 200 * MiB
    shutil.rmtree(tmp_path / "registry", ignore_errors=True)
