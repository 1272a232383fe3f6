"""Lazily held images measured (issue 29; `python -m bench.image_bench --only lazy`): a
sandbox of an image its node never held, started over the node's block service
(`AENV_LAZY_IMAGES=on`) against the same image fetched whole (lazy off) and against a node
that holds it locally.

Three nodes of `bench.fleetrig` (one API, SeaweedFS, NATS), no warm VMs, each with an image
cache of its own: A keeps the machine's and imports the image (a local OCI layout: a busybox
layer and one layer of `--lazy-size` MiB of random files, 2 GiB by default); B (lazy on) and
C (lazy off) start with the machine's base image, runtime disk and kernel hard-linked in,
never the import. Measured, each a create timed from `Sandbox.create` to its first
command's answer:

  local        creates on A, which holds the image (its raw disk in the page cache)
  lazy_first   B's first create: its capture fetched, the image a stub over the block service
  lazy_warm    B's next creates: the chunks the first one read are in B's cache
  whole_first  C's first create: the image fetched whole before the restore

with the bytes B's block service fetched (its stats.json) against the image's stored bytes,
and in the guest (as root, envd's own Python) a file of the payload read sequentially in
1 MiB reads and at random in 4 KiB reads, the guest's page cache dropped before each pass:
on A over its local raw disk, on B over the block service once its chunks are cached. The
issue's goals are printed beside the figures.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench.fleetrig import Fleet, fleet_rig
from bench.stats import ratio, summary

__all__ = ["borrow_cache", "forget_import", "lazy_vs_whole"]

MiB = 1 << 20
METRICS_TOKEN = "bench-" + secrets.token_hex(8)
#: payload files are cut in pieces of this size; the guest reads the first one
PIECE_MIB = 256
#: random 4 KiB reads per guest pass
RANDOM_READS = 2000
#: free disk the bench must leave on the host
KEEP_FREE = 20 * 10**9
#: the host's disk for the run, as a multiple of the payload: the layout, A's unpacked layer
#: and disk, the repository's chunks, C's whole copy, the import's spool, and slack
DISK_FACTOR = 7

#: run in the guest by envd's runtime Python (the image has none): sequential MB/s of a
#: cold pass (what the block service fetched), of a warm one, and random 4 KiB IOPS
GUEST_READS = """
import json, os, random, sys, time
path, n = sys.argv[1], int(sys.argv[2])
def drop():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")
def seq():
    drop()
    fd = os.open(path, os.O_RDONLY)
    t, got = time.monotonic(), 0
    while True:
        b = os.read(fd, 1 << 20)
        if not b:
            break
        got += len(b)
    dt = time.monotonic() - t
    os.close(fd)
    return round(got / dt / 1e6, 1)
def rnd():
    drop()
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    pages = os.fstat(fd).st_size // 4096
    rng = random.Random(7)
    offs = [rng.randrange(pages) * 4096 for _ in range(n)]
    t = time.monotonic()
    for o in offs:
        os.pread(fd, 4096, o)
    dt = time.monotonic() - t
    os.close(fd)
    return round(n / dt, 1)
first = seq()
print(json.dumps({"seq_first_mb_s": first, "seq_mb_s": seq(), "rand_4k_iops": rnd()}))
"""


def _say(message: str) -> None:
    print(f"image_bench lazy: {message}", file=sys.stderr, flush=True)


def borrow_cache(cache: Path, dest: Path) -> None:
    """A node's own image cache: what `cache` holds now (the base image, envd's runtime
    disk, the kernel), hard-linked; not later imports."""
    dest.mkdir(parents=True)
    names = ["kernel-resolved.json", "images", "recipes", "names"]
    names += [p.name for p in cache.glob("kernel-*") if p.is_dir()]
    for name in names:
        if (cache / name).exists():
            subprocess.run(["cp", "-al", str(cache / name), str(dest / name)], check=True)


def forget_import(cache: Path, name: str) -> None:
    """An import's `names/`, `recipes/` links and its `images/<content>` entry."""
    for link in (cache / "names").glob(f"tpl-{name}:*"):
        entry = link.resolve()
        recipe = cache / "recipes" / Path(os.readlink(link)).name
        link.unlink()
        recipe.unlink(missing_ok=True)
        if entry.parent == cache / "images":
            shutil.rmtree(entry, ignore_errors=True)


def _payload_layout(root: Path, mib: int) -> tuple[Path, list[str]]:
    """An OCI layout of a busybox layer and a layer of `mib` MiB of random files under
    /opt/payload (pieces of `PIECE_MIB`); with its diff ids. Layers uncompressed: gzip
    gains nothing on random bytes and would cost a minute per GiB here."""
    import hashlib

    from tests.registry import busybox_tree
    from workers.node.image.oci_write import tar_tree, write_layout

    base = busybox_tree(root / "base", "sha256sum")
    payload = root / "payload"
    (payload / "opt/payload").mkdir(parents=True)
    left, i = mib, 0
    while left > 0:
        piece = min(left, PIECE_MIB)
        with (payload / f"opt/payload/blob{i}").open("wb") as f:
            for _ in range(piece):
                f.write(os.urandom(MiB))
        left, i = left - piece, i + 1
    layers = [tar_tree(base, compress=False), tar_tree(payload, compress=False)]
    shutil.rmtree(payload)
    out = root / "layout"
    write_layout(out, layers)
    return out, ["sha256:" + hashlib.sha256(layer).hexdigest() for layer in layers]


def _cordon(fleet: Fleet, node: str, verb: str) -> None:
    import httpx

    r = httpx.post(
        f"{fleet.api_url(0)}/nodes/{node}/{verb}",
        headers={"X-API-KEY": fleet.api_key},
        timeout=60,
    )
    r.raise_for_status()


def _only(fleet: Fleet, node: str) -> None:
    """Every create from now on lands on `node`: the other running nodes cordoned."""
    for role in fleet.nodes:
        if role.proc is not None and role.proc.poll() is None:
            _cordon(fleet, role.name, "uncordon" if role.name == node else "cordon")


def _create(fleet: Fleet, name: str, node: str, reads: str | None = None) -> tuple[float, Any]:
    """Seconds from `Sandbox.create` to its first command's answer (the sandbox killed
    after); with `reads` (a file of the payload), the guest's read figures too."""
    import httpx
    from e2b import Sandbox

    from workers.node.image.scripts import GUEST_PYTHON

    t0 = time.monotonic()
    url = fleet.api_url(0)
    sbx = Sandbox.create(name, timeout=600, api_url=url, sandbox_url=url, api_key=fleet.api_key)
    try:
        sbx.commands.run("true")
        took = time.monotonic() - t0
        r = httpx.get(
            f"{fleet.api_url(0)}/sandboxes/{sbx.sandbox_id}", headers={"X-API-KEY": fleet.api_key}
        )
        if r.json()["nodeID"] != node:
            raise RuntimeError(f"{name}: created on {r.json()['nodeID']}, not {node}")
        if reads is None:
            return took, None
        sbx.files.write("/home/user/reads.py", GUEST_READS)
        py = f"PYTHONHOME={GUEST_PYTHON} {GUEST_PYTHON}/lib/ld-linux-x86-64.so.2"
        py += f" --library-path {GUEST_PYTHON}/lib {GUEST_PYTHON}/bin/python3 -S"
        out = sbx.commands.run(
            f"{py} /home/user/reads.py {reads} {RANDOM_READS}", user="root", timeout=900
        )
        return took, json.loads(out.stdout)
    finally:
        sbx.kill()


def _stats(fleet: Fleet, node: str) -> dict[str, Any]:
    """The node's block service counters (rewritten about once a second)."""
    time.sleep(2)
    path = fleet.nodes[[r.name for r in fleet.nodes].index(node)].data_dir
    return dict(json.loads((path / "node/blocks/stats.json").read_text()))


def _whole_fetches(fleet: Fleet, node: str) -> float:
    from bus import BusSettings
    from tests.series import node_url, scrape

    samples = scrape(node_url(BusSettings(nats_url=fleet.nats.url), node), METRICS_TOKEN)
    return samples.get(("aenv_image_fetch_bytes_total", frozenset({("node", node)})), 0.0)


def _whole_fetch_logged(fleet: Fleet, node: str, digest: str) -> dict[str, float]:
    """The node's own account of fetching the image whole (`CacheShelf.fetch_content`'s
    progress line): MiB and seconds."""
    role = fleet.nodes[[r.name for r in fleet.nodes].index(node)]
    line = re.compile(rf"image {digest[:12]} \([^)]*by content\): fetched (\d+) MiB in ([\d.]+)s")
    found = line.findall(role.log.read_text(errors="replace"))
    return {"mib": float(found[-1][0]), "s": float(found[-1][1])} if found else {}


def _image_sizes(cache: Path, name: str) -> tuple[str, int, int]:
    """The import's content digest, disk size and stored (non-zero chunk) bytes."""
    link = next((cache / "names").glob(f"tpl-{name}:*"))
    doc = json.loads((link.resolve() / "manifest.json").read_text())["content"]
    stored = sum(1 for c in doc["chunks"] if c) * int(doc["chunk_size"])
    return link.resolve().name, int(doc["size"]), stored


def lazy_vs_whole(root: Path, mib: int, n: int = 3) -> dict[str, Any]:
    """The measurement above, for a payload of `mib` MiB; `n` creates of each repeated row."""
    from tests.registry import MACHINE_CACHE
    from tests.support import session_tag
    from workers.node.image.oci_chains import chain_dir, chain_ids

    (root / "rig").mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root).free
    if free - DISK_FACTOR * mib * MiB < KEEP_FREE:
        raise RuntimeError(f"{free / 1e9:.0f} GB free: too little for {mib} MiB and 20 GB left")
    _say(f"making a {mib} MiB payload layer")
    layout, diff_ids = _payload_layout(root / "src", mib)
    name = f"lazyb-{uuid.uuid4().hex[:6]}"
    reads = "/opt/payload/blob0"
    env = {"AENV_HEARTBEAT_S": "1", "AENV_WARM_POOL_MIB": "0", "AENV_METRICS_TOKEN": METRICS_TOKEN}
    node_env = {
        "fleet-b": {"AENV_IMAGE_CACHE": str(root / "b-images"), "AENV_LAZY_IMAGES": "on"},
        "fleet-c": {"AENV_IMAGE_CACHE": str(root / "c-images"), "AENV_LAZY_IMAGES": "off"},
    }
    try:
        with fleet_rig(
            root / "rig", apis=1, nodes=3, env=env, tag=session_tag(), node_env=node_env, started=1
        ) as fleet:
            for node in ("b", "c"):
                borrow_cache(MACHINE_CACHE, root / f"{node}-images")
            _say("importing it on node A")
            t0 = time.monotonic()
            out = fleet.aenv(
                "pull", str(layout), "--name", name, "--api-url", fleet.api_url(0),
                "--api-key", fleet.api_key, timeout=1800,
            )  # fmt: skip
            if out.returncode != 0:
                raise RuntimeError(f"aenv pull: {out.stderr}")
            while fleet.capture_key(name) is None:
                if time.monotonic() - t0 > 1800:
                    raise RuntimeError(f"{name}: its capture was never uploaded")
                time.sleep(1)
            imported = time.monotonic() - t0
            shutil.rmtree(root / "src")
            digest, size, stored = _image_sizes(MACHINE_CACHE, name)
            _say(f"creates on A (local), then guest reads there: image {stored >> 20} MiB")
            local = [_create(fleet, name, "fleet-a")[0] for _ in range(n)]
            local_reads = _create(fleet, name, "fleet-a", reads)[1]
            for role in fleet.nodes[1:]:
                role.start()
            for role in fleet.nodes[1:]:
                role.wait_ready()
            _only(fleet, "fleet-b")
            _say("first create on B (lazy)")
            lazy_first = _create(fleet, name, "fleet-b")[0]
            at_first = _stats(fleet, "fleet-b")["exports"][digest]["bytes_fetched"]
            lazy_warm = [_create(fleet, name, "fleet-b")[0] for _ in range(n)]
            _say("guest reads on B (a cold pass, then warm ones)")
            lazy_reads = _create(fleet, name, "fleet-b", reads)[1]
            after_reads = _stats(fleet, "fleet-b")["exports"][digest]["bytes_fetched"]
            _only(fleet, "fleet-c")
            _say("first create on C (whole fetch)")
            whole_before = _whole_fetches(fleet, "fleet-c")
            whole_first = _create(fleet, name, "fleet-c")[0]
            whole_bytes = _whole_fetches(fleet, "fleet-c")
            whole_logged = _whole_fetch_logged(fleet, "fleet-c", digest)
    finally:
        forget_import(MACHINE_CACHE, name)
        for chain in chain_ids(diff_ids):
            shutil.rmtree(chain_dir(MACHINE_CACHE / "layers", chain), ignore_errors=True)
    loc, warm = summary(local, unit="s", scale=1.0), summary(lazy_warm, unit="s", scale=1.0)
    fraction = round(at_first / stored, 4)
    return {
        "payload_mib": mib,
        "image": {"disk_bytes": size, "stored_bytes": stored, "import_s": round(imported, 1)},
        "create_local": loc,
        "lazy_first_s": round(lazy_first, 2),
        "whole_first_s": round(whole_first, 2),
        "lazy_warm": warm,
        "bytes_fetched_first_create": at_first,
        "bytes_fetched_after_guest_reads": after_reads,
        "whole_fetch_bytes": {"metric": whole_bytes, "before_create": whole_before},
        "whole_fetch_logged": whole_logged,
        "fetched_over_stored": fraction,
        "warm_over_local_p50": ratio(warm, loc),
        "guest_reads": {"local": local_reads, "lazy": lazy_reads},
        "goals": {
            "first_start_s_le_local_plus_2": [lazy_first, round(loc["p50"] + 2, 2)],
            "first_start_ok": lazy_first <= loc["p50"] + 2,
            "bytes_fetched_le_25pct": fraction <= 0.25,
            "warm_create_le_1_1x": (ratio(warm, loc) or 99) <= 1.1,
            "guest_seq_ge_0_8x": _ge(lazy_reads, local_reads, "seq_mb_s"),
            "guest_rand_ge_0_8x": _ge(lazy_reads, local_reads, "rand_4k_iops"),
        },
    }


def _ge(lazy: dict[str, float], local: dict[str, float], key: str) -> list[Any]:
    """[lazy ÷ local, whether it reaches 0.8]."""
    r = round(lazy[key] / local[key], 3)
    return [r, r >= 0.8]
