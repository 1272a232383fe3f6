"""E2B volumes through the unchanged SDK (`e2b` 2.63's `Volume` and `volume_mounts`), on
real microVMs: a volume mounted in two sandboxes one after the other keeps what the first
wrote; one sandbox at a time (409); no fork or snapshot of a sandbox with a volume; a
pause and resume keeps the mount; the volume's own content API reads and writes it; its
versions are chunks in the stack's S3, from which a node without its local copy pulls it;
destroyed, it is gone. And the npm SDK's Volume API, which is the same."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from e2b import Sandbox, Volume
from e2b.exceptions import SandboxException, VolumeException, VolumeNotFoundException

from tests.e2e.conftest import AENV, Stack

pytestmark = pytest.mark.vm

MOUNT = "/mnt/data"
BIG = os.urandom(3 * 1024 * 1024 + 12345)


def _name() -> str:
    return f"e2e-{uuid.uuid4().hex[:8]}"


def _volume_log(stack: Stack, volume_id: str) -> list[object]:
    from bus import Bus, BusSettings

    async def read() -> list[object]:
        bus = await Bus.connect(BusSettings(nats_url=stack.nats_url), setup=False)
        try:
            return [rec.event for rec in await bus.volumes.read(volume_id)]
        finally:
            await bus.close()

    return asyncio.run(read())


def _s3_manifests(stack: Stack) -> tuple[list[str], dict[str, object]]:
    """The manifest ids in the stack's S3 bucket, and a function's worth of access: what
    the node was configured with (its environment, set by the supervisor)."""
    from workers.snapshot import S3Config, S3Store

    node = json.loads((stack.data_dir / "stack.json").read_text())["roles"]["node"]
    env = dict(
        kv.split("=", 1) for kv in Path(f"/proc/{node}/environ").read_text().split("\0") if kv
    )

    async def read() -> tuple[list[str], dict[str, object]]:
        store = await S3Store.open(
            S3Config(
                bucket=env.get("AENV_S3_BUCKET", "aenv-snapshots"),
                endpoint_url=env["AENV_S3_ENDPOINT"],
                access_key=env["AENV_S3_ACCESS_KEY"],
                secret_key=env["AENV_S3_SECRET_KEY"],
            )
        )
        try:
            ids = await store.list_manifests()
            docs = {i: json.loads(await store.get_manifest(i)) for i in ids if i.startswith("vol-")}
            present = {}
            for i, doc in docs.items():
                chunks = [c for c in doc["image"]["chunks"] if c]
                present[i] = all([await store.has_blob(c) for c in chunks]) and bool(chunks)
            return ids, present
        finally:
            await store.close()

    return asyncio.run(read())


def test_a_volume_outlives_its_sandboxes_and_is_one_sandboxs_at_a_time(stack: Stack) -> None:
    name = _name()
    vol = Volume.create(name)
    assert vol.name == name and vol.token
    assert name in [v.name for v in Volume.list()]
    info = Volume.get_info(vol.volume_id)
    assert info.token == vol.token and info.volume_id == vol.volume_id
    with pytest.raises(VolumeException):  # a name is unique per team
        Volume.create(name)

    a = Sandbox.create(timeout=600, volume_mounts={MOUNT: vol})
    try:
        assert a.get_info().volume_mounts == [{"name": name, "path": MOUNT}]
        a.files.write(f"{MOUNT}/big.bin", BIG)
        a.files.write(f"{MOUNT}/notes/small.txt", "a few bytes")
        a.commands.run(
            f"chmod 600 {MOUNT}/notes/small.txt && printf '#!/bin/sh\\necho hi\\n' "
            f"> {MOUNT}/run.sh && chmod 755 {MOUNT}/run.sh && "
            f"ln -s notes/small.txt {MOUNT}/link"
        )

        # one sandbox at a time, and the refusal names the holder
        with pytest.raises(SandboxException) as held:
            Sandbox.create(timeout=60, volume_mounts={MOUNT: name})
        assert "409" in str(held.value) or a.sandbox_id in str(held.value)
        assert a.sandbox_id in str(held.value)
        # no copies of a sandbox with a volume
        with pytest.raises(SandboxException, match="volumes mounted"):
            a.fork(count=1)
        with pytest.raises(SandboxException, match="volumes mounted"):
            a.create_snapshot()
        # the volume API is for a volume no sandbox mounts
        with pytest.raises(VolumeException, match=a.sandbox_id):
            vol.list("/")
        with pytest.raises(VolumeException):  # nor can it be destroyed under a sandbox
            Volume.destroy(vol.volume_id)

        # a pause and a resume keep the mount and its data
        assert a.pause()
        back = Sandbox.connect(a.sandbox_id, timeout=600)
        assert back.files.read(f"{MOUNT}/notes/small.txt") == "a few bytes"
        back.files.write(f"{MOUNT}/after-resume.txt", "still mounted")
    finally:
        Sandbox.kill(a.sandbox_id)

    # the next sandbox (created at once: the API waits for the release) reads it all back
    b = Sandbox.create(timeout=600, volume_mounts={MOUNT: name})
    try:
        got = b.files.read(f"{MOUNT}/big.bin", format="bytes")
        assert hashlib.sha256(bytes(got)).digest() == hashlib.sha256(BIG).digest()
        out = b.commands.run(
            f"cd {MOUNT} && stat -c '%n %a' notes/small.txt run.sh && "
            "readlink link && ./run.sh && cat after-resume.txt"
        ).stdout
        assert out.splitlines() == [
            "notes/small.txt 600",
            "run.sh 755",
            "notes/small.txt",
            "hi",
            "still mounted",
        ]
    finally:
        Sandbox.kill(b.sandbox_id)

    # its own API, once no sandbox mounts it
    vol = Volume.connect(vol.volume_id)
    entries = {e.name: e for e in vol.list("/")}
    assert {"big.bin", "notes", "run.sh", "link", "after-resume.txt"} <= set(entries)
    assert entries["run.sh"].mode == 0o755 and entries["notes"].type.value == "directory"
    assert entries["link"].type.value == "symlink" and entries["link"].target == "notes/small.txt"
    assert entries["big.bin"].size == len(BIG)
    assert vol.read_file("/big.bin", format="bytes") == BIG
    assert vol.read_file("/notes/small.txt") == "a few bytes"
    deep = {e.path for e in vol.list("/", depth=2)}
    assert "/notes/small.txt" in deep
    written = vol.write_file(
        "/from-api/hello.txt", "written by the volume API", mode=0o640, force=True
    )
    assert written.mode == 0o640 and written.size == len("written by the volume API")
    assert vol.make_dir("/made").type.value == "directory"
    assert vol.update_metadata("/made", mode=0o700).mode == 0o700
    assert vol.exists("/run.sh") and not vol.exists("/nope")
    vol.remove("/run.sh")
    assert not vol.exists("/run.sh")

    # stored through the snapshot repository: chunks in S3, under its own manifest kind
    ids, present = _s3_manifests(stack)
    mine = [i for i in ids if i.startswith(f"vol-{vol.volume_id}-")]
    assert mine and all(present[i] for i in mine), (mine, present)

    # a node without its local copy pulls it from S3
    shutil.rmtree(stack.data_dir / "node" / "volumes" / vol.volume_id)
    c = Sandbox.create(timeout=600, volume_mounts={MOUNT: name})
    try:
        assert c.files.read(f"{MOUNT}/from-api/hello.txt") == "written by the volume API"
        assert not c.files.exists(f"{MOUNT}/run.sh")
        assert c.commands.run(f"stat -c %a {MOUNT}/made").stdout.strip() == "700"
    finally:
        Sandbox.kill(c.sandbox_id)

    assert Volume.destroy(vol.volume_id) is True
    with pytest.raises(VolumeNotFoundException):
        Volume.get_info(vol.volume_id)
    assert Volume.destroy(vol.volume_id) is False
    assert name not in [v.name for v in Volume.list()]
    kinds = [type(e).__name__ for e in _volume_log(stack, vol.volume_id)]
    assert kinds[0] == "VolumeCreated" and kinds[-1] == "VolumeDestroyed"
    assert kinds.count("VolumeAttached") == kinds.count("VolumeReleased") >= 5


def test_mounting_an_unknown_volume_is_404_and_a_bad_path_400(stack: Stack) -> None:
    with pytest.raises(SandboxException, match="not found"):
        Sandbox.create(timeout=60, volume_mounts={MOUNT: "no-such-volume"})
    vol = Volume.create(_name())
    try:
        with pytest.raises(SandboxException, match="path"):
            Sandbox.create(timeout=60, volume_mounts={"relative/path": vol})
    finally:
        Volume.destroy(vol.volume_id)


def test_the_npm_sdk_volume_api_is_the_same(stack: Stack) -> None:
    """The JavaScript SDK: create, list, write, read, list a directory, info, destroy (no
    VM needed: the volume API works on the stack's nodes' copies)."""
    npm = Path(__file__).resolve().parents[2] / ".npm-e2b"
    if not (npm / "node_modules" / "e2b").is_dir() or shutil.which("node") is None:
        pytest.skip("the npm e2b SDK is not installed (scripts/setup.sh)")
    name = _name()
    script = (
        "const {Volume} = require('e2b');"
        "(async () => {"
        " const name = process.argv[1];"
        " const vol = await Volume.create(name);"
        " const listed = (await Volume.list()).map(v => v.name).includes(name);"
        " await vol.writeFile('/js/hello.txt', 'from node', {force: true});"
        " const text = await vol.readFile('/js/hello.txt');"
        " const entries = (await vol.list('/js')).map(e => e.name);"
        " const info = await Volume.getInfo(vol.volumeId);"
        " const destroyed = await Volume.destroy(vol.volumeId);"
        " console.log(JSON.stringify({listed, text, entries, token: info.token === vol.token,"
        "   destroyed}));"
        "})().catch(e => {console.error(e); process.exit(1)})"
    )
    run = subprocess.run(
        ["node", "-e", script, name],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
        cwd=npm,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got == {
        "listed": True,
        "text": "from node",
        "entries": ["hello.txt"],
        "token": True,
        "destroyed": True,
    }


def test_the_cli_moves_files_in_and_out_of_a_volume(stack: Stack, tmp_path: Path) -> None:
    """`aenv volume files put|ls|get|rm` (the volume's own API, on the stack's node)."""
    env = {**os.environ, **stack.env()}

    def aenv(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*AENV, *args], env=env, capture_output=True, text=True, timeout=120)

    name = _name()
    assert aenv("volume", "create", name).returncode == 0
    local = tmp_path / "in.bin"
    local.write_bytes(BIG[:100_000])
    put = aenv("volume", "files", "put", name, str(local), "/deep/dir/in.bin", "--mode", "600")
    assert put.returncode == 0, put.stderr
    listed = aenv("volume", "files", "ls", name, "/deep", "-d", "2", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    rows = {r["path"]: r for r in json.loads(listed.stdout)}
    row = rows["/deep/dir/in.bin"]
    assert row["mode"] == "0600" and row["size"] == 100_000 and rows["/deep/dir"]
    got = aenv("volume", "files", "get", name, "/deep/dir/in.bin", str(tmp_path / "out.bin"))
    assert got.returncode == 0 and (tmp_path / "out.bin").read_bytes() == BIG[:100_000]
    assert aenv("volume", "files", "rm", name, "/deep").returncode == 0
    missing = aenv("volume", "files", "get", name, "/deep/dir/in.bin")
    assert missing.returncode == 1, missing.stderr
    assert aenv("volume", "rm", name).returncode == 0


def test_a_paused_sandbox_with_a_volume_resumes_on_another_node(stack: Stack, n2: Path) -> None:
    """The volume travels with the pause: its image is uploaded with the capture, and a
    node that takes the sandbox over (its own node gone) pulls both and moves the
    attachment to itself; the kill there releases the volume with what was written."""
    from tests.e2e.test_pause import _uploaded
    from tests.e2e.test_two_nodes import _node_of, _second_node
    from tests.support import eventually_sync

    with _second_node(stack, n2, AENV_HEARTBEAT_S="0.5") as node:
        sbx, vol = None, None
        for _ in range(12):  # placement is whoever pulls first: a fresh volume each try
            vol = Volume.create(_name())
            sbx = Sandbox.create(timeout=600, volume_mounts={MOUNT: vol})
            if _node_of(stack, sbx.sandbox_id) == "e2e-two":
                break
            Sandbox.kill(sbx.sandbox_id)
        assert sbx is not None and vol is not None and _node_of(stack, sbx.sandbox_id) == "e2e-two"
        node.sandboxes.append(sbx)
        sbx.files.write(f"{MOUNT}/travels.txt", "with its sandbox")
        assert sbx.pause()
        eventually_sync(lambda: _uploaded(stack, sbx.sandbox_id), timeout=120, interval=1)
        node.die()
        back = Sandbox.connect(sbx.sandbox_id, timeout=600)
        assert _node_of(stack, sbx.sandbox_id) != "e2e-two"
        assert back.files.read(f"{MOUNT}/travels.txt") == "with its sandbox"
        back.files.write(f"{MOUNT}/after-move.txt", "written on the new node")
        Sandbox.kill(sbx.sandbox_id)
        vol = Volume.connect(vol.volume_id)  # (its reads wait for the new node's release)
        assert vol.read_file("/after-move.txt") == "written on the new node"
        assert vol.read_file("/travels.txt") == "with its sandbox"
        attached = [
            e for e in _volume_log(stack, vol.volume_id) if type(e).__name__ == "VolumeAttached"
        ]
        assert [getattr(e, "node_id", None) for e in attached][-2:] == ["e2e-two", "e2e"]
    Volume.destroy(vol.volume_id)
