"""A take-over fetches the disks its capture names (issue 41): two nodes, each with its own
data dir and image cache. The second node starts with an EMPTY cache and fetches the base
image and envd's runtime disk from the repository (images-at-scale S5); a sandbox on it
writes 5,000 small files, pauses, and the node dies. The sandbox resumes on the first node:
every file is byte-identical (sha256 of each), and its root filesystem, taken from a
filesystem-only pause and converted to raw, passes `e2fsck -fn`.

And the other way round: a capture taken over base bytes the resuming node never had (a
build of the same recipe elsewhere, published in the repository) is stacked on those very
bytes, fetched by content — not refused, and never stacked on the node's own build."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from e2b import Sandbox

from tests.e2e.conftest import Stack
from tests.e2e.test_two_nodes import _node_of, _second_node

pytestmark = [pytest.mark.vm, pytest.mark.timeout(900)]

#: 5,000 in `make test-scale` (the design's figure); CI moves 1,000 (the same paths: many
#: small files, a pause, a take-over, a filesystem-only pause and a cold boot) in less time
FILES = 5000 if os.environ.get("AENV_TEST_SCALE", "") not in ("", "0") else 1000
#: One guest command (bash builtins only: no fork per file, which TCG makes slow), each
#: file's bytes its own (its number, the shell's random numbers, a length that varies).
WRITE = (
    "set -e; mkdir -p /home/user/many && cd /home/user/many && "
    f"for i in $(seq 1 {FILES}); do "
    'printf "file %d %d %d %s\\n" $i $RANDOM $SRANDOM "$(printf %*s $((i % 300)) "")" > f$i; '
    "done; sync"
)
#: sha256 of every file, in one process: `<digest>  <name>` lines
SUMS = "cd /home/user/many && find . -type f -print0 | xargs -0 sha256sum"


def _sums(sbx: Sandbox) -> dict[str, str]:
    out = sbx.commands.run(SUMS, timeout=300).stdout
    return {name: digest for digest, name in (ln.split(None, 1) for ln in out.splitlines())}


def _latest_pause(stack: Stack, sandbox_id: str) -> tuple[str, bool]:
    """The snapshot id and memory flag of the sandbox's latest `SandboxPaused` (the log)."""
    import asyncio

    from bus import Bus, BusSettings
    from domain import sandbox as sb

    async def read() -> tuple[str, bool]:
        bus = await Bus.connect(BusSettings(nats_url=stack.nats_url), setup=False)
        try:
            paused = [
                rec.event
                for rec in await bus.sandboxes.read(sandbox_id)
                if isinstance(rec.event, sb.SandboxPaused)
            ]
        finally:
            await bus.close()
        assert paused and paused[-1].snapshot_id, paused
        return paused[-1].snapshot_id, paused[-1].memory

    return asyncio.run(read())


def _e2fsck_raw(disk_top: Path) -> subprocess.CompletedProcess[str]:
    """`e2fsck -fn` of the filesystem a qcow2 chain holds, converted to a raw file first
    (sparse; removed afterwards). The chain is the pause's frozen top over the base."""
    size = json.loads(
        subprocess.run(
            ["qemu-img", "info", "-U", "--output=json", str(disk_top)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )["virtual-size"]
    scratch = Path(tempfile.gettempdir())
    free = shutil.disk_usage(scratch).free
    # the raw copy is sparse: only the chain's data lands, but keep room for all of it
    assert free > min(size, 16 << 30), (
        f"{scratch}: {free >> 20} MiB free for a {size >> 20} MiB disk"
    )
    fd, name = tempfile.mkstemp(prefix="aenv-take-over-", suffix=".raw", dir=scratch)
    os.close(fd)
    raw = Path(name)
    try:
        subprocess.run(
            ["qemu-img", "convert", "-U", "-O", "raw", str(disk_top), str(raw)],
            check=True,
            capture_output=True,
            timeout=600,
        )
        return subprocess.run(
            ["e2fsck", "-fn", str(raw)], capture_output=True, text=True, timeout=600
        )
    finally:
        raw.unlink(missing_ok=True)


def test_thousands_of_files_move_with_their_sandbox(
    stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from tests.e2e.test_pause import _uploaded
    from tests.support import eventually_sync
    from workers.node.image.build import find_image
    from workers.node.image.cache import RECIPES, cache_root
    from workers.node.image.content import content_of

    cache = tmp_path_factory.mktemp("images-b")  # empty: the node fetches what it runs
    data = tmp_path_factory.mktemp("node-b")
    try:
        with _second_node(
            stack,
            data,
            AENV_HEARTBEAT_S="0.5",
            AENV_IMAGE_CACHE=str(cache),
            AENV_CODE_INTERPRETER="0",
        ) as node:
            # its base image: the first node's bytes, fetched (by content), not built
            ours = find_image("base", cache_root())
            theirs = (cache / RECIPES / ours.digest).resolve()
            assert theirs.name == content_of(ours.rootfs)  # images/<content>: the same bytes
            assert not any(cache.glob("rootfs-*")), "the second node debootstrapped"

            sbx = node.place()
            sid = sbx.sandbox_id
            sbx.commands.run(WRITE, timeout=600)
            sums = _sums(sbx)
            assert len(sums) == FILES
            assert len(set(sums.values())) == FILES  # each file its own bytes
            assert sbx.pause()
            eventually_sync(lambda: _uploaded(stack, sid), timeout=180, interval=1)
            node.die()

            back = Sandbox.connect(sid, timeout=600)
            assert _node_of(stack, sid) != "e2e-two"
            assert _sums(back) == sums  # every file, byte for byte

            # a filesystem-only pause: the guest syncs, QEMU quits, the capture is the disk
            assert back.pause(keep_memory=False)
            snapshot_id, memory = _latest_pause(stack, sid)
            assert not memory
            capture_dir = stack.data_dir / "node" / "snapshots" / snapshot_id
            capture = json.loads((capture_dir / "manifest.json").read_text())
            assert capture["disk_only"]
            fsck = _e2fsck_raw(Path(capture["disk_top"]))
            assert fsck.returncode == 0, fsck.stdout + fsck.stderr
            # the filesystem checked is the sandbox's: its inodes count the files
            used = re.search(r": (\d+)/\d+ files", fsck.stdout)
            assert used is not None and int(used.group(1)) > FILES, fsck.stdout

            again = Sandbox.connect(sid, timeout=600)  # a cold boot of that disk
            assert _sums(again) == sums
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)


@pytest.mark.skipif(
    os.environ.get("AENV_TEST_SCALE", "") in ("", "0"),
    reason="make test-scale (in CI: integration test_fetch_by_content.py)",
)
def test_a_capture_over_bytes_this_node_lacks_fetches_them(
    stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The second node's base is another build of the recipe (other bytes), published in
    the repository: the first node, which never had those bytes, fetches them by content
    and stacks the capture on them (the refusal of test_same_bytes is for bytes that are
    nowhere); its own build of the recipe stays what its recipe names."""
    import asyncio

    from tests.e2e.test_pause import _uploaded
    from tests.e2e.test_same_bytes import _own_image_cache
    from tests.support import eventually_sync
    from workers.node.image.build import find_image
    from workers.node.image.cache import IMAGES, cache_root

    shared = cache_root()
    cache, recipe = _own_image_cache(shared, tmp_path_factory.mktemp("images-b"), other_bytes=False)
    mine = cache / recipe / "root.ext4"
    with open(mine, "r+b") as f:  # bytes of its own (not test_same_bytes's: that one is nowhere)
        f.seek(os.fstat(f.fileno()).st_size - 8192)
        f.write(secrets.token_bytes(32))
    content = asyncio.run(_publish(stack, cache / recipe))
    ours = find_image("base", shared)
    fetched = shared / IMAGES / content
    assert not fetched.exists()
    data = tmp_path_factory.mktemp("node-b")
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
            sbx.files.write("/home/user/bytes.txt", "written over the second node's build")
            assert sbx.pause()
            eventually_sync(lambda: _uploaded(stack, sid), timeout=180, interval=1)
            node.die()
            back = Sandbox.connect(sid, timeout=600)
            assert _node_of(stack, sid) != "e2e-two"
            assert back.files.read("/home/user/bytes.txt") == "written over the second node's build"
            assert back.commands.run("echo over its own bytes").stdout == "over its own bytes\n"
            assert (fetched / "root.ext4").is_file()  # fetched by content into the cache
            assert find_image("base", shared).rootfs == ours.rootfs  # the recipe did not move
            back.kill()
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(fetched, ignore_errors=True)


async def _publish(stack: Stack, entry: Path) -> str:
    """Upload a cache entry to the stack's repository as `image-<content>`, with the
    builder's manifest (what a node's S5 publish sends); returns the content digest."""
    from aenv.roles.common import RoleSettings
    from tests.e2e.test_two_nodes import _node_env
    from workers.snapshot import ImageRepository, S3Config, S3Store

    env = _node_env(stack, entry)  # the stack's node's settings: its S3
    endpoint = env["AENV_S3_ENDPOINT"]
    store = await S3Store.open(
        S3Config(
            bucket=env.get("AENV_S3_BUCKET", RoleSettings.model_fields["s3_bucket"].default),
            endpoint_url=endpoint,
            access_key=env.get("AENV_S3_ACCESS_KEY"),
            secret_key=env.get("AENV_S3_SECRET_KEY"),
        )
    )
    try:
        meta = json.loads((entry / "manifest.json").read_text())
        meta.pop("content", None)
        up = await ImageRepository(store).upload_image(
            entry, recipe=str(meta["digest"]), role="root", label="test", meta=meta
        )
        return up.manifest.digest
    finally:
        await store.close()
