"""A node that never held an image runs it lazily (issue 29), through the unchanged `e2b`
SDK: node A imports a registry image (a local OCI layout: busybox and two files of random
bytes, one read at once and one only after the block service is killed) and uploads its
template; node B, started only then with `AENV_LAZY_IMAGES=on` and an image cache of its
own (the machine's base image, runtime disk and kernel hard-linked in, never the import),
takes the create while A is cordoned. B holds no `root.ext4` of the import — a stub over its
block service — the guest reads the file's exact bytes, and the block service fetched less
than the image stores. The block service killed -9 under the running guest is restarted by
the node, and the guest's read of blocks never fetched before comes through (QEMU
reconnects). B killed -9 with the sandbox paused adopts the service when it starts again,
and the sandbox resumes there; a second pause's capture is uploaded (its chain walked down
to the stub, never uploading it), and once B is stopped the sandbox resumes on A over A's
whole copy of the same bytes, files intact. The image has a second layer: a file of it read
at once, and after the kill every regular file of the image's own paths (/bin, /opt) is
hashed in the guest and must equal the layers' trees on the host.

Scale form (`make test-scale`): `AENV_LAZY_IMAGE_MIB=2048` adds that many MiB of random
files to the first layer (/opt/lazy/bulk), and B must have fetched less than a quarter of
the image's stored bytes when it has read the last layer's file."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import Sandbox

from bench.fleetrig import Fleet, RigError, Role, fleet_rig
from bench.image_lazy import borrow_cache, forget_import
from shared.lazybase import LAZY_ROOT
from tests.registry import MACHINE_CACHE, busybox_tree
from tests.support import eventually_sync, session_tag
from workers.node.image.oci_chains import chain_dir, chain_ids

#: the scale form's random payload (MiB) in the first layer; 0 in CI
BULK_MIB = int(os.environ.get("AENV_LAZY_IMAGE_MIB", "0"))

pytestmark = [pytest.mark.vm, pytest.mark.fleet, pytest.mark.timeout(2400 if BULK_MIB else 600)]

#: read in the guest (two chunks and a bit) / not read until the service was killed (what a
#: lazy node must not have fetched before)
READ_MIB, UNREAD_MIB = 9, 32
METRICS_TOKEN = "lazy-" + secrets.token_hex(8)
#: templates this module imported on A, and their layers' diff ids (their images and
#: unpacked layers leave the machine's cache after)
IMPORTED: list[str] = []
DIFF_IDS: list[str] = []


def lazy_pair(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    env: dict[str, str],
    imported: list[str],
    diff_ids: list[str],
    *,
    drop_root: bool = False,
) -> Iterator[Fleet]:
    """One API and node A running; node B configured (lazy, a cache of its own), started by
    the test once A holds the import. Afterwards A's imports (`imported`, their layers'
    `diff_ids`) leave the machine's shared cache, and with `drop_root` the rig's own
    directory goes too."""
    if os.geteuid() != 0:
        pytest.skip("the fleet runs microVMs: needs root")
    root = Path(tmp_path_factory.mktemp(name))
    node_env = {
        "fleet-b": {"AENV_IMAGE_CACHE": str(root / "fleet-b-images"), "AENV_LAZY_IMAGES": "on"}
    }
    try:
        with fleet_rig(
            root, apis=1, nodes=2, env=env, tag=session_tag(), node_env=node_env, started=1
        ) as f:
            yield f
    except RigError as e:
        pytest.fail(str(e))
    finally:  # A's imports, out of the machine's shared cache once no node runs
        for template in imported:
            forget_import(MACHINE_CACHE, template)
        for chain in chain_ids(diff_ids):
            shutil.rmtree(chain_dir(MACHINE_CACHE / "layers", chain), ignore_errors=True)
        if drop_root:
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    env = {
        "AENV_HEARTBEAT_S": "1",
        "AENV_WARM_POOL_MIB": "0",
        "AENV_METRICS_TOKEN": METRICS_TOKEN,
    }
    # the scale form's repository and caches: GiBs, not kept for a look
    yield from lazy_pair(
        tmp_path_factory, "aenv-lazy", env, IMPORTED, DIFF_IDS, drop_root=bool(BULK_MIB)
    )


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _image(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The two layers' trees (busybox, the lazy files and any bulk; one file of the last
    layer) and their OCI layout, layers uncompressed (gzip gains nothing on random bytes)."""
    from workers.node.image.oci_write import tar_tree, write_layout

    tree = busybox_tree(tmp_path / "tree", "sha256sum", "find")
    (tree / "opt/lazy").mkdir(parents=True)
    (tree / "opt/lazy/read.bin").write_bytes(os.urandom(READ_MIB << 20))
    (tree / "opt/lazy/unread.bin").write_bytes(os.urandom(UNREAD_MIB << 20))
    if BULK_MIB:
        (tree / "opt/lazy/bulk").mkdir()
        for i in range(0, BULK_MIB, 256):
            with (tree / f"opt/lazy/bulk/blob{i // 256}").open("wb") as f:
                for _ in range(min(256, BULK_MIB - i)):
                    f.write(os.urandom(1 << 20))
    last = tmp_path / "last"
    (last / "opt/last").mkdir(parents=True)
    (last / "opt/last/last.bin").write_bytes(os.urandom(3 << 20))
    out = tmp_path / "layout"
    layers = [tar_tree(tree, compress=False), tar_tree(last, compress=False)]
    write_layout(out, layers)
    DIFF_IDS.extend("sha256:" + hashlib.sha256(layer).hexdigest() for layer in layers)
    return tree, last, out


def _tree_hashes(*trees: Path) -> dict[str, str]:
    """sha256 of every regular file under /bin and /opt of the layers stacked (a later
    layer's file over an earlier one's): what the guest must read. /etc is left out: the
    import rewrites passwd and group, and the node writes hostname, hosts, resolv.conf."""
    got: dict[str, str] = {}
    for tree in trees:
        for top in ("bin", "opt"):
            for path in (tree / top).rglob("*"):
                if path.is_file() and not path.is_symlink():
                    got["/" + str(path.relative_to(tree))] = _sha256(path)
    return got


def _guest_hashes(sbx: Sandbox) -> dict[str, str]:
    """sha256 of every regular file under the guest's /bin and /opt, its root disk only
    (-xdev: envd's runtime is mounted at /opt/aenv)."""
    out = sbx.commands.run("find /bin /opt -xdev -type f -exec sha256sum {} +", timeout=900).stdout
    return {path: digest for digest, path in (ln.split(None, 1) for ln in out.splitlines())}


def _node(fleet: Fleet, sandbox_id: str) -> str:
    r = httpx.get(
        f"{fleet.api_url(0)}/sandboxes/{sandbox_id}", headers={"X-API-KEY": fleet.api_key}
    )
    r.raise_for_status()
    return str(r.json()["nodeID"])


def _cordon(fleet: Fleet, node: str, verb: str) -> None:
    r = httpx.post(
        f"{fleet.api_url(0)}/nodes/{node}/{verb}",
        headers={"X-API-KEY": fleet.api_key},
        timeout=60,
    )
    assert r.status_code == 200, r.text


def _block_series(fleet: Fleet) -> None:
    """B's scrape: every `aenv_blocks_*` series, the restart counted, the bytes fetched."""
    from bus import BusSettings
    from tests.series import BLOCKS, node_url, samples, scrape

    got = scrape(node_url(BusSettings(nats_url=fleet.nats.url), "fleet-b"), METRICS_TOKEN)
    assert samples(BLOCKS) <= {name for name, _ in got}, got
    mine = frozenset({("node", "fleet-b")})
    assert got[("aenv_blocks_restarts_total", mine)] == 1
    assert got[("aenv_blocks_fetch_bytes_total", mine)] >= READ_MIB << 20


def _no_service_left(node: Role) -> None:
    """A block service B left behind (the test failed while B was down): ended here."""
    pid_file = node.data_dir / "node" / "blocks" / "blocks.pid"
    if (node.proc is None or node.proc.poll() is not None) and pid_file.exists():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGTERM)


def _gone(fleet: Fleet, node_id: str) -> bool:
    """Whether the API counts the node gone (its heartbeats stopped): a resume of its
    durable capture is then placed, not sent to its queue."""
    import asyncio

    from aenv.ops.fleet import read_beats
    from bus.nodes import is_gone

    beats = {b.node_id: b for b in asyncio.run(read_beats(fleet.nats.url))}
    return is_gone(beats.get(node_id), time.time())


def _uploaded(fleet: Fleet, sandbox_id: str) -> bool:
    """Whether the sandbox's latest pause's capture is durable (`SnapshotUploaded`)."""
    import asyncio

    from bus import Bus, BusSettings
    from domain import sandbox as sb

    async def read() -> bool:
        bus = await Bus.connect(BusSettings(nats_url=fleet.nats.url), setup=False)
        try:
            events = [rec.event for rec in await bus.sandboxes.read(sandbox_id)]
        finally:
            await bus.close()
        paused = [e.snapshot_id for e in events if isinstance(e, sb.SandboxPaused)]
        done = {e.snapshot_id for e in events if isinstance(e, sb.SnapshotUploaded)}
        return bool(paused) and paused[-1] in done

    return asyncio.run(read())


def test_a_node_that_never_held_an_image_runs_it_lazily(pair: Fleet, tmp_path: Path) -> None:
    t0 = time.monotonic()
    sdk: dict[str, Any] = pair.sdk(0)
    b_cache = pair.root / "fleet-b-images"
    borrow_cache(MACHINE_CACHE, b_cache)  # before A imports anything
    tree, last, layout = _image(tmp_path)
    hashes = _tree_hashes(tree, last)
    want, unread = hashes["/opt/lazy/read.bin"], hashes["/opt/lazy/unread.bin"]
    name = f"lazy-{uuid.uuid4().hex[:6]}"
    IMPORTED.append(name)
    out = pair.aenv(
        "pull", str(layout), "--name", name,
        "--api-url", sdk["api_url"], "--api-key", pair.api_key, timeout=1800,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    eventually_sync(lambda: pair.capture_key(name), timeout=900, interval=1)
    shutil.rmtree(layout)  # the scale form's GiBs: hashed already, in the repository now
    shutil.rmtree(tree)
    imported = time.monotonic() - t0

    b = pair.nodes[1]
    b.start()
    b.wait_ready()
    _cordon(pair, "fleet-a", "cordon")  # every create and resume lands on B
    sbx: Sandbox | None = None
    try:
        sbx = Sandbox.create(name, timeout=300, **sdk)
        assert _node(pair, sbx.sandbox_id) == "fleet-b"
        got = sbx.commands.run("sha256sum /opt/lazy/read.bin", timeout=120).stdout
        assert got.split()[0] == want
        got = sbx.commands.run("sha256sum /opt/last/last.bin", timeout=120).stdout
        assert got.split()[0] == hashes["/opt/last/last.bin"]  # the last layer's file

        lazy = [d for d in (b_cache / "images").iterdir() if (d / LAZY_ROOT).exists()]
        assert len(lazy) == 1, lazy  # the import, held lazily: no whole disk of it on B
        assert not (lazy[0] / "root.ext4").exists()
        whole = MACHINE_CACHE / "images" / lazy[0].name / "root.ext4"
        assert whole.is_file()  # A holds the very same bytes whole
        doc = json.loads((lazy[0] / "manifest.json").read_text())
        size = doc["content"]["size"]
        stored = sum(1 for c in doc["content"]["chunks"] if c) * doc["content"]["chunk_size"]
        stats_file = b.data_dir / "node" / "blocks" / "stats.json"

        def counted() -> int:  # the stats file is rewritten about once a second
            n = int(json.loads(stats_file.read_text())["exports"][lazy[0].name]["bytes_fetched"])
            return n if n >= READ_MIB << 20 else 0

        fetched = eventually_sync(counted, timeout=15)
        print(
            f"lazy: image {size >> 20} MiB, stored {stored >> 20} MiB, fetched {fetched >> 20} MiB"
        )
        assert fetched < size
        assert fetched < stored - (UNREAD_MIB << 20) // 2  # the unread file stayed away
        if BULK_MIB:  # the scale form: a fraction of a multi-GiB image
            assert fetched < stored // 4, (fetched, stored)

        # the block service killed -9 under the running guest: the node starts another on
        # the same socket, QEMU reconnects, and a read of blocks never fetched comes through
        blocks_pid = b.data_dir / "node" / "blocks" / "blocks.pid"
        killed = int(blocks_pid.read_text())
        os.kill(killed, signal.SIGKILL)
        t_kill = time.monotonic()
        got = sbx.commands.run("sha256sum /opt/lazy/unread.bin", timeout=120).stdout
        assert got.split()[0] == unread
        print(f"lazy: a read {time.monotonic() - t_kill:.1f} s after the service was killed -9")
        assert int(blocks_pid.read_text()) != killed
        t_all = time.monotonic()
        assert _guest_hashes(sbx) == hashes  # every file of the image, byte-identical
        print(f"lazy: {len(hashes)} files hashed in the guest in {time.monotonic() - t_all:.0f} s")
        _block_series(pair)

        sbx.files.write("/home/user/lazy.txt", "written over a lazy base")
        assert sbx.pause()
        # B killed -9 (its VMs die with it, not its block service): started again, it
        # adopts the service, and the paused sandbox resumes over the lazy base through it
        serving = int(blocks_pid.read_text())
        b.kill9()
        b.start()
        b.wait_ready()
        assert int(blocks_pid.read_text()) == serving
        assert f"block service: adopted pid {serving}" in b.log.read_text()
        back = Sandbox.connect(sbx.sandbox_id, timeout=300, **sdk)
        assert _node(pair, sbx.sandbox_id) == "fleet-b"
        assert back.files.read("/home/user/lazy.txt") == "written over a lazy base"
        assert back.commands.run("sha256sum /opt/lazy/read.bin").stdout.split()[0] == want

        # the other way: a capture over the lazy base resumes over A's whole copy
        assert back.pause()
        eventually_sync(lambda: _uploaded(pair, sbx.sandbox_id), timeout=120, interval=1)
        b.stop()  # a normal stop: no VM reads through the service, it ends too
        assert not (b.data_dir / "node" / "blocks" / "blocks.pid").exists()
        eventually_sync(lambda: _gone(pair, "fleet-b"), timeout=15, interval=0.5)
        _cordon(pair, "fleet-a", "uncordon")
        moved = Sandbox.connect(sbx.sandbox_id, timeout=300, **sdk)
        assert _node(pair, sbx.sandbox_id) == "fleet-a"
        assert moved.files.read("/home/user/lazy.txt") == "written over a lazy base"
        assert moved.commands.run("sha256sum /opt/lazy/read.bin").stdout.split()[0] == want
        print(f"lazy: imported on A in {imported:.0f} s, all in {time.monotonic() - t0:.0f} s")
    finally:
        _cordon(pair, "fleet-a", "uncordon")
        if sbx is not None:
            Sandbox.kill(sbx.sandbox_id, **sdk)
        _no_service_left(b)
