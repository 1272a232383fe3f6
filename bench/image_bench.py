"""Image pull + convert benchmark: a ≥ 1 GiB two-layer image from a real registry on
loopback (`docker-registry`), pulled into a cold layer cache and again into a warm one (a
second image sharing the big layer: only its own small layer is downloaded), then both
converted into guest images (unpack + user + mkfs): the first with nothing unpacked before,
the second starting from the first's unpacked layer.

Every figure sits next to the raw primitive in the same run: a bare `skopeo copy` of the
same image into an empty directory for the pull, and `tar -x` of the same layers plus
`mkfs.ext4 -d` for the conversion — the ratio is what aenv's layer cache, verification and
guest preparation add. Run as root: `python -m bench.image_bench [--gib 1] [--n 2]`.

`fleet` (`bench/image_fetch.py`): two nodes, each with its own image cache — the first create
of a template on the node that never held it (capture and base bytes fetched) against a
create on the node that built it, beside the raw restore. `lazy` (`bench/image_lazy.py`,
issue 29): a first create on a node that never held the image with lazy images on against
the whole fetch and a local create, the bytes fetched, warm creates, and guest reads over
the block service against a local disk (`--lazy-size` MiB of payload, 2 GiB by default).
`--only pull|fleet|disk|lazy` runs one part.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.stats import emit, ratio, summary
from tests.registry import local_registry, push
from workers.node.image import base_rootfs_tree, build_from_oci
from workers.node.image.disk import DEFAULT_FREE, make_ext4, need_bytes, root_size
from workers.node.image.oci_chains import chain_dir, chain_ids
from workers.node.image.oci_write import tar_tree, write_layout
from workers.node.image.registry import parse_reference, pull

MIB = 1 << 20


def _say(message: str) -> None:
    print(f"image_bench: {message}", file=sys.stderr, flush=True)


def _image(root: Path, gib: float) -> tuple[Path, Path, int, list[str]]:
    """Two layouts sharing a big layer (the Debian base tree + `gib` GiB of incompressible
    files); the second adds a small layer of its own. Returns them, the image's bytes and
    the second image's diff ids."""
    big = root / "big"
    (big / "data").mkdir(parents=True)
    # cp -a, not shutil.copytree: the tree has device nodes (copytree would read /dev/console)
    base = base_rootfs_tree(progress=lambda m: None)
    subprocess.run(["cp", "-a", str(base), str(big / "rootfs")], check=True)
    left = int(gib * 1024 * MIB)
    i = 0
    while left > 0:
        size = min(left, 128 * MIB)
        (big / "data" / f"blob{i}").write_bytes(os.urandom(size))
        left, i = left - size, i + 1
    small = root / "small"
    (small / "etc").mkdir(parents=True)
    (small / "etc/extra.conf").write_text("the second image's own layer\n")
    layers = [tar_tree(big, compress=False), tar_tree(small, compress=False)]
    one, two = root / "one", root / "two"
    write_layout(one, layers[:1])
    write_layout(two, layers)
    diff_ids = ["sha256:" + hashlib.sha256(layer).hexdigest() for layer in layers]
    return one, two, len(layers[0]), diff_ids


def _raw_pull(ref: str, dest: Path) -> float:
    t0 = time.monotonic()
    subprocess.run(
        [
            "skopeo",
            "copy",
            "--quiet",
            "--src-tls-verify=false",
            f"docker://{ref}",
            f"oci:{dest}:image",
        ],
        check=True,
        capture_output=True,
    )
    return time.monotonic() - t0


def _raw_convert(layout: Path, work: Path) -> float:
    """The primitive under a conversion: untar every layer blob, mkfs the tree."""
    import json

    t0 = time.monotonic()
    tree = work / "tree"
    tree.mkdir(parents=True)
    index = json.loads((layout / "index.json").read_text())
    digest = index["manifests"][0]["digest"].split(":", 1)[1]
    manifest = json.loads((layout / "blobs/sha256" / digest).read_text())
    for layer in manifest["layers"]:
        blob = layout / "blobs/sha256" / layer["digest"].split(":", 1)[1]
        subprocess.run(["tar", "-xf", str(blob), "-C", str(tree)], check=True)
    make_ext4(tree, work / "root.ext4", root_size(need_bytes(tree), DEFAULT_FREE))
    took = time.monotonic() - t0
    shutil.rmtree(work)
    return took


def _convert(layout: Path, name: str, blobs: Path) -> tuple[float, Path]:
    t0 = time.monotonic()
    img = build_from_oci(
        layout, name, progress=lambda m: None, force=True, ref="image", blobs=blobs
    )
    took = time.monotonic() - t0
    shutil.rmtree(img.rootfs.parent, ignore_errors=True)
    (img.rootfs.parent.parent / "names" / name).unlink(missing_ok=True)
    return took, img.rootfs.parent.parent


def main(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="aenv-imgbench-", dir="/var/tmp"))
    samples: dict[str, list[float]] = {
        k: []
        for k in (
            "pull_cold",
            "pull_warm",
            "raw_pull",
            "convert_cold",
            "convert_warm",
            "raw_convert",
        )
    }
    try:
        _say(f"making a {args.gib} GiB image")
        one, two, size, diff_ids = _image(work / "src", args.gib)
        with local_registry(work / "registry") as registry:
            _say("pushing it to a docker-registry on loopback")
            ref_one = push(one, registry, "bench/big", "1")
            ref_two = push(two, registry, "bench/big-plus", "1")
            for i in range(args.n):
                _say(f"round {i + 1}/{args.n}: pull into a cold layer cache, then a warm one")
                cache = work / f"cache{i}"
                t0 = time.monotonic()
                cold = pull(parse_reference(ref_one), cache=cache, progress=lambda m: None)
                samples["pull_cold"].append(time.monotonic() - t0)
                t0 = time.monotonic()
                warm = pull(parse_reference(ref_two), cache=cache, progress=lambda m: None)
                samples["pull_warm"].append(time.monotonic() - t0)
                assert (warm.layers_cached, warm.layers_fetched) == (1, 1), warm
                samples["raw_pull"].append(_raw_pull(ref_one, work / f"raw{i}"))
                _say(f"round {i + 1}/{args.n}: convert (unpack cache cold, then warm)")
                took, root = _convert(cold.layout, f"imgbench-{i}", cold.blobs)
                samples["convert_cold"].append(took)
                took, root = _convert(warm.layout, f"imgbench-{i}-plus", warm.blobs)
                samples["convert_warm"].append(took)
                for chain in chain_ids(diff_ids):  # the next round's unpack starts cold again
                    shutil.rmtree(chain_dir(root / "layers", chain), ignore_errors=True)
                samples["raw_convert"].append(_raw_convert(work / f"raw{i}", work / f"rc{i}"))
                shutil.rmtree(cache, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    stats = {k: summary(v, unit="s", scale=1.0) for k, v in samples.items()}
    mb = size / 1e6
    return {
        "image_bytes": size,
        **stats,
        "pull_cold_mb_per_s": round(mb / stats["pull_cold"]["p50"], 1),
        "raw_pull_mb_per_s": round(mb / stats["raw_pull"]["p50"], 1),
        "convert_cold_mb_per_s": round(mb / stats["convert_cold"]["p50"], 1),
        "raw_convert_mb_per_s": round(mb / stats["raw_convert"]["p50"], 1),
        "pull_cold_vs_raw": ratio(stats["pull_cold"], stats["raw_pull"]),
        "pull_warm_vs_cold": ratio(stats["pull_warm"], stats["pull_cold"]),
        "convert_cold_vs_raw": ratio(stats["convert_cold"], stats["raw_convert"]),
        "convert_warm_vs_cold": ratio(stats["convert_warm"], stats["convert_cold"]),
    }


def fleet(args: argparse.Namespace) -> dict[str, Any]:
    """`bench.image_fetch`: a template's first create on a node that never held it."""
    import asyncio

    from bench.fleet_bench import raw_primitive
    from bench.image_fetch import fetch_vs_local

    raw = asyncio.run(raw_primitive(args.n))
    root = Path(tempfile.mkdtemp(prefix="aenv-imgfetch-", dir="/var/tmp"))
    try:
        return {"raw_primitive": raw, **fetch_vs_local(root, args.templates, raw)}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def lazy(args: argparse.Namespace) -> dict[str, Any]:
    """`bench.image_lazy`: a never-held image started over the block service."""
    from bench.image_lazy import lazy_vs_whole

    root = Path(tempfile.mkdtemp(prefix="aenv-imglazy-", dir="/var/tmp"))
    try:
        return lazy_vs_whole(root, args.lazy_size)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def disk(args: argparse.Namespace) -> dict[str, Any]:
    """`bench.image_disk`: node disk per image after import and first create."""
    from bench.image_disk import disk_per_image

    root = Path(tempfile.mkdtemp(prefix="aenv-imgdisk-", dir="/var/tmp"))
    try:
        return disk_per_image(root, args.disk_images, args.disk_mib)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=1.0, help="size of the big layer's data")
    parser.add_argument("--n", type=int, default=2, help="rounds")
    parser.add_argument(
        "--only",
        choices=("pull", "fleet", "disk", "lazy"),
        help="one part: registry pull, fleet fetch, node disk per image, or lazy images",
    )
    parser.add_argument(
        "--lazy-size", type=int, default=2048, help="lazy: MiB of random payload in the image"
    )
    parser.add_argument("--disk-mib", type=int, default=300, help="disk: random MiB per image")
    parser.add_argument("--disk-images", type=int, default=3, help="disk: images imported")
    parser.add_argument("--templates", type=int, default=3, help="fleet: templates built")
    args = parser.parse_args()
    doc: dict[str, Any] = {}
    if args.only in (None, "pull"):
        doc.update(main(args))
    if args.only in (None, "fleet"):
        doc["fleet"] = fleet(args)
    if args.only in (None, "disk"):
        doc["disk"] = disk(args)
    if args.only in (None, "lazy"):
        doc["lazy"] = lazy(args)
    emit("image", doc)
