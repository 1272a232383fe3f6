"""Node disk per image (images-at-scale S14, issue 42; `image_bench --only disk`): how many
bytes a node's disk holds for an image, divided by the image's uncompressed size, after
its import and after the first sandbox created from it (goal ≤ 1.2x).

Images of random content (incompressible: gzip, ext4 and S3 cannot shrink them, so the
ratio is what aenv keeps, not what the data allows), one layer each — a small glibc tree
(`tests/registry.py::debian_tree`), a seed of its own and `mib` MiB of random files —
pushed to a `docker-registry` on loopback. One `aenv up` stack whose node has an image
cache of its own and a fresh state dir; the cache starts with hard links of the machine's
kernel, base image and runtime disk (what every node holds before any import; counted in
the baseline, so not in any Δ). Each image is imported through the unchanged e2b SDK
(`Template.build(from_image)`) and one sandbox is created from it. After each step the
node's two roots are walked (`workers/node/disk/usage.py::scan`, allocated bytes by
category) and the Δ over the walk before the import is divided by the image's bytes (the
layer tar's). The sandbox is killed at the end and a last walk taken, so the breakdown also
shows what a running VM adds. What the disk budget can regenerate (`evict.REGENERABLE`:
layer chains, RAM-pool copies, OCI blobs and layouts, debootstrap trees, the blob cache) is
reported apart: what of it an import still holds once it finished is what dropping it
after a successful import would save. Captures, RAM-pool copies and a running VM's RAM
file are the guest's memory, a fixed cost per template whatever the image's size: they
weigh less in the ratio the larger the image (`--disk-mib`).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench.stats import summary
from tests.registry import debian_tree, local_registry, push
from tests.support import tagged
from tests.vmstack import running_stack
from workers.node.disk import IMAGES, STATE, scan
from workers.node.disk.categories import CATEGORIES, Category
from workers.node.disk.evict import REGENERABLE
from workers.node.image.oci_write import tar_tree, write_layout

MIB = 1 << 20
#: the machine's image cache: the kernel, base image and runtime disk the node starts with
MACHINE_CACHE = Path("/var/lib/aenv/images")
#: what of the machine's cache is not linked in: other images' pulls and unpacked layers
NOT_LINKED = ("blobs", "oci", "layers", ".locks")
GOAL = 1.2
STEPS = ("import", "create", "kill")


def _say(message: str) -> None:
    print(f"image_disk: {message}", file=sys.stderr, flush=True)


def _own_cache(root: Path) -> Path:
    """An image cache of the node's own: hard links of the machine's kernel and images
    (no pulls, no chains), so the node starts without building or fetching anything."""
    root.mkdir(parents=True)
    for entry in sorted(MACHINE_CACHE.iterdir()):
        if entry.name in NOT_LINKED or entry.name.startswith("rootfs-"):
            continue
        subprocess.run(["cp", "-al", str(entry), str(root / entry.name)], check=True)
    return root


def _image(root: Path, mib: int, seed: str) -> tuple[Path, int]:
    """A one-layer OCI layout: a small glibc tree, `seed`, `mib` MiB of random files.
    Returns it and the layer's uncompressed bytes (the image's size)."""
    tree = debian_tree(root / "tree", "bash", "cat", "sha256sum")
    (tree / "etc/aenv-bench-seed").write_text(seed + "\n")
    data = tree / "data"
    data.mkdir()
    left, i = mib * MIB, 0
    while left > 0:
        size = min(left, 64 * MIB)
        (data / f"random{i}").write_bytes(os.urandom(size))
        left, i = left - size, i + 1
    layer = tar_tree(tree, compress=False)
    shutil.rmtree(tree)
    write_layout(root / "layout", [layer])
    return root / "layout", len(layer)


def _delta(after: dict[Category, int], before: dict[Category, int]) -> dict[str, int]:
    """Per-category growth, the categories that changed only."""
    return {c: after[c] - before[c] for c in CATEGORIES if after[c] != before[c]}


def _one(
    roots: list[tuple[Any, Path]], ref: str, name: str, size: int, seed: str
) -> dict[str, Any]:
    """Import `ref` as template `name`, create a sandbox from it, kill it; the walks."""
    from e2b import Sandbox, Template

    walks: dict[str, dict[Category, int]] = {"before": scan(roots).bytes}
    t0 = time.monotonic()
    Template.build(Template().from_image(ref), name)
    took = {"import_s": round(time.monotonic() - t0, 1)}
    walks["import"] = scan(roots).bytes
    t0 = time.monotonic()
    sbx = Sandbox.create(name, timeout=600)
    try:
        got = sbx.commands.run("cat /etc/aenv-bench-seed").stdout
        if got != seed + "\n":
            raise RuntimeError(f"{name}: the sandbox is not the image ({got!r})")
        took["create_s"] = round(time.monotonic() - t0, 1)
        walks["create"] = scan(roots).bytes
    finally:
        sbx.kill()
    time.sleep(2)  # the node removes the VM's directory after the kill
    walks["kill"] = scan(roots).bytes
    before = walks["before"]
    out: dict[str, Any] = {"image_bytes": size, **took}
    for step in STEPS:
        grew = _delta(walks[step], before)
        out[step] = {
            "ratio": round(sum(grew.values()) / size, 3),
            "bytes": sum(grew.values()),
            "by_category": grew,
            "regenerable_bytes": sum(v for c, v in grew.items() if c in REGENERABLE),
        }
    return out


def _dominant(per_image: list[dict[str, Any]], step: str) -> list[dict[str, Any]]:
    """The categories of `step`'s growth, largest first, as a share of the image bytes."""
    total: dict[str, int] = {}
    for one in per_image:
        for c, v in one[step]["by_category"].items():
            total[c] = total.get(c, 0) + v
    size = sum(one["image_bytes"] for one in per_image)
    return [
        {"category": c, "ratio": round(v / size, 3), "regenerable": c in REGENERABLE}
        for c, v in sorted(total.items(), key=lambda kv: -kv[1])
    ]


def disk_per_image(work: Path, images: int, mib: int) -> dict[str, Any]:
    """The measurement above in `work` (deleted by the caller)."""
    need = images * mib * MIB * 5 + (4 << 30)  # layout + registry + cache + root disk + room
    free = shutil.disk_usage(work).free
    if free < need + (20 << 30):
        raise RuntimeError(f"{free >> 30} GiB free; the bench needs {need >> 30} + 20 GiB")
    cache = _own_cache(work / "images")
    data = work / "stack"
    prefix = tagged("aenvd")
    env = {
        **os.environ,
        "AENV_SLOT_PREFIX": prefix,
        "AENV_NODE_ID": "diskbench",
        "AENV_IMAGE_CACHE": str(cache),
        "AENV_WARM_POOL_MIB": "0",
    }
    per_image: list[dict[str, Any]] = []
    with local_registry(work / "registry") as registry:
        refs = []
        for i in range(images):
            seed = secrets.token_hex(16)
            _say(f"image {i + 1}/{images}: {mib} MiB of random files, pushed")
            made, size = _image(work / f"img{i}", mib, seed)
            refs.append((push(made, registry, "bench/disk", f"{i}-{seed[:8]}"), size, seed))
            shutil.rmtree(work / f"img{i}")
        _say("aenv up: a node with an image cache of its own")
        with running_stack(data, env, prefix):
            roots = [(STATE, data / "node"), (IMAGES, cache)]
            for i, (ref, size, seed) in enumerate(refs):
                _say(f"image {i + 1}/{images}: import, then a sandbox from it")
                name = f"disk-{uuid.uuid4().hex[:8]}"
                per_image.append(_one(roots, ref, name, size, seed))
                _say(f"image {i + 1}/{images}: {per_image[-1]['create']['ratio']}x")
    out: dict[str, Any] = {"images": images, "image_mib": mib, "goal": GOAL}
    for step in STEPS:
        ratios = [one[step]["ratio"] for one in per_image]
        out[f"{step}_ratio"] = summary(ratios, unit="x", scale=1.0)
        out[f"{step}_dominant"] = _dominant(per_image, step)
    import_regen = [one["import"]["regenerable_bytes"] / one["image_bytes"] for one in per_image]
    out["regenerable_after_import_ratio"] = summary(import_regen, unit="x", scale=1.0)
    out["disk_per_image_ratio"] = out["create_ratio"]["p50"]
    out["meets_goal"] = out["create_ratio"]["p99"] <= GOAL
    out["per_image"] = per_image
    return out
