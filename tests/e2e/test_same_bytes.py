"""Never run a sandbox over different bytes (issue 40): two nodes, each with its own data
dir and image cache, the second node's base image another build of the same recipe (other
bytes). A sandbox paused on that node, the node killed: the resume on the first node is
refused with both content digests named — never a guest over the wrong ext4 — and the
sandbox stays paused; with its node back it resumes there, files intact."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from shared.diskdigest import chunk_list
from tests.e2e.conftest import Stack
from tests.e2e.test_two_nodes import _node_of, _second_node

pytestmark = pytest.mark.vm


def _own_image_cache(shared: Path, dest: Path, *, other_bytes: bool) -> tuple[Path, str]:
    """A node's own image cache holding what the shared one has for the `base` image
    (kernel, runtime disks: hard links, read-only to both), except the base image's root
    disk: a copy, with `other_bytes` one byte changed in its free space — another build of
    the same recipe, as two nodes that each ran mkfs have. It is laid out as an entry built
    before content keys (under its recipe, no content digest recorded), so the node hashes
    it itself. Returns the cache and the base image's recipe."""
    from workers.node.image.build import find_image
    from workers.node.image.cache import IMAGES, RECIPES

    base = find_image("base", shared)
    dest.mkdir(parents=True, exist_ok=True)
    for entry in shared.iterdir():
        if entry.is_dir() and entry.name.startswith(("kernel-", "runtime-")):
            subprocess.run(["cp", "-al", str(entry), str(dest / entry.name)], check=True)
    (dest / IMAGES).mkdir()
    (dest / RECIPES).mkdir()
    for link in (shared / RECIPES).glob("runtime-*"):
        target = link.resolve()
        subprocess.run(["cp", "-al", str(target), str(dest / IMAGES / target.name)], check=True)
        (dest / RECIPES / link.name).symlink_to(f"../{IMAGES}/{target.name}")
    shutil.copy(shared / "kernel-resolved.json", dest / "kernel-resolved.json")
    mine = dest / base.digest
    mine.mkdir()
    for name in ("vmlinux", "initrd.cpio"):
        os.link(base.rootfs.parent / name, mine / name)
    subprocess.run(
        ["cp", "--sparse=always", str(base.rootfs), str(mine / "root.ext4")],
        check=True,
    )
    if other_bytes:
        with open(mine / "root.ext4", "r+b") as f:  # the last block: free, never read
            f.seek(os.fstat(f.fileno()).st_size - 4096)
            f.write(b"other bytes")
    doc = json.loads((base.rootfs.parent / "manifest.json").read_text())
    doc.pop("content", None)
    (mine / "manifest.json").write_text(json.dumps(doc, indent=2))
    return dest, base.digest


def _resume_failures(stack: Stack, sandbox_id: str) -> list[str]:
    """The reasons of the sandbox's `SandboxResumeFailed` events (the log, not the API)."""
    import asyncio

    from bus import Bus, BusSettings
    from domain import sandbox as sb

    async def read() -> list[str]:
        bus = await Bus.connect(BusSettings(nats_url=stack.nats_url), setup=False)
        try:
            return [
                rec.event.reason
                for rec in await bus.sandboxes.read(sandbox_id)
                if isinstance(rec.event, sb.SandboxResumeFailed)
            ]
        finally:
            await bus.close()

    return asyncio.run(read())


def test_a_sandbox_is_never_resumed_over_other_bytes(
    stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from e2b import Sandbox

    from tests.e2e.test_pause import _uploaded
    from tests.support import eventually_sync
    from workers.node.image.build import find_image
    from workers.node.image.cache import cache_root

    shared = cache_root()
    cache, recipe = _own_image_cache(shared, tmp_path_factory.mktemp("images-a"), other_bytes=True)
    data = tmp_path_factory.mktemp("node-a")
    headers = {"X-API-KEY": stack.api_key}
    try:
        with _second_node(
            stack,
            data,
            AENV_HEARTBEAT_S="0.5",
            AENV_IMAGE_CACHE=str(cache),
            AENV_CODE_INTERPRETER="0",
        ) as node:
            sbx = node.place()
            sid = sbx.sandbox_id
            sbx.files.write("/home/user/bytes.txt", "written over node A's base")
            assert sbx.pause()
            snapshot_id = eventually_sync(lambda: _uploaded(stack, sid), timeout=120, interval=1)

            # the capture recorded the bytes it was taken over: node A's own disk's
            ours = chunk_list(cache / recipe / "root.ext4").digest
            theirs = chunk_list(find_image("base", shared).rootfs).digest
            assert ours != theirs
            capture = json.loads(
                (data / "node" / "snapshots" / str(snapshot_id) / "manifest.json").read_text()
            )
            assert capture["base_content"] == ours
            assert capture["runtime_content"] == chunk_list(Path(capture["runtime_disk"])).digest

            node.die()
            r = httpx.post(
                f"{stack.api_url}/sandboxes/{sid}/connect",
                json={"timeout": 60},
                headers=headers,
                timeout=120,
            )
            assert r.status_code == 503, r.text  # it waits for its node, as a stranded one
            body = r.json()
            assert body["code"] == r.status_code, body
            assert ours in body["message"] and theirs in body["message"], body
            assert "stays paused" in body["message"], body
            refused = _resume_failures(stack, sid)  # the log's record of it
            assert any(ours in r and theirs in r for r in refused), refused
            info = httpx.get(f"{stack.api_url}/sandboxes/{sid}", headers=headers, timeout=30)
            assert info.json()["state"] == "paused", info.text
            assert _node_of(stack, sid) == "e2e-two"

            node.start()  # where its bytes are: it resumes there, its files intact
            back = Sandbox.connect(sid, timeout=600)
            assert _node_of(stack, sid) == "e2e-two"
            assert back.files.read("/home/user/bytes.txt") == "written over node A's base"
            assert back.commands.run("echo same bytes").stdout == "same bytes\n"
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)


@pytest.mark.skipif(
    os.environ.get("AENV_TEST_SCALE", "") in ("", "0"),
    reason="make test-scale (in CI: test_take_over.py, same bytes on another node)",
)
def test_a_copy_of_the_same_bytes_takes_the_sandbox(
    stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The check is on bytes, not on a file: a node whose own image cache holds a copy of
    the same base image (another path, another inode) takes a sandbox paused elsewhere."""
    from e2b import Sandbox

    from tests.e2e.test_pause import _uploaded
    from tests.support import eventually_sync
    from workers.node.image.cache import cache_root

    shared = cache_root()
    cache, _ = _own_image_cache(shared, tmp_path_factory.mktemp("images-a"), other_bytes=False)
    data = tmp_path_factory.mktemp("node-a")
    try:
        with _second_node(
            stack,
            data,
            AENV_HEARTBEAT_S="0.5",
            AENV_IMAGE_CACHE=str(cache),
            AENV_CODE_INTERPRETER="0",
        ) as node:
            sbx = node.place()
            sid = sbx.sandbox_id
            sbx.files.write("/home/user/bytes.txt", "the same bytes on both nodes")
            assert sbx.pause()
            eventually_sync(lambda: _uploaded(stack, sid), timeout=120, interval=1)
            node.die()
            back = Sandbox.connect(sid, timeout=600)
            assert _node_of(stack, sid) != "e2e-two"
            assert back.files.read("/home/user/bytes.txt") == "the same bytes on both nodes"
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)
