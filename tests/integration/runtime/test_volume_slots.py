"""Volume slots on real microVMs: a template captured with placeholder slots restores with
a volume's image in a slot, envd mounts it (flushing what the guest cached of the
placeholder first), what the guest writes is in the image (read on the host with debugfs,
no mount), a memory pause and resume keeps the mount, and a second VM sees the first's
files after it released them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.integration.runtime.conftest import sdk
from workers.node.ports import GuestConfig, GuestVolume
from workers.node.runtime import Runtime, Snapshot, http_request
from workers.node.volumes.content import Owner, VolumeContent
from workers.node.volumes.images import VolumeImages

pytestmark = pytest.mark.vm

VOL = GuestVolume(volume_id="vol1", name="data", path="/mnt/data")


def init_body(vm_id: str) -> dict[str, object]:
    return GuestConfig(volumes=(VOL,)).init_body(vm_id)


async def release(vm_host: str) -> dict[str, object]:
    import json

    status, body = await http_request(
        vm_host,
        49983,
        "POST",
        "/volumes/release",
        json.dumps({"paths": [VOL.path]}).encode(),
        timeout=20,
    )
    assert status == 200, body
    doc: dict[str, object] = json.loads(body)
    return doc


async def test_a_volume_in_a_slot_is_mounted_written_and_kept(
    runtime: Runtime, template: Snapshot, tmp_path: Path
) -> None:
    assert template.machine.volume_slots == 4
    images = VolumeImages(tmp_path / "volumes", None)
    async with images.lock("vol1"):
        image = await images.prepare("vol1", None, "sbx-a")
    assert image.stat().st_size == 64 << 30 and image.stat().st_blocks * 512 < 64 << 20

    vm, _ = await runtime.restore(
        template, private_memory=False, init=init_body("a"), volumes=(image,)
    )
    try:
        s = sdk(vm)
        out = await asyncio.to_thread(
            lambda: s.commands.run(
                "stat -c '%U %a' /mnt/data && findmnt -n -o SOURCE,FSTYPE /mnt/data && "
                "head -c 3000000 /dev/urandom > /mnt/data/big.bin && "
                "echo hello > /mnt/data/small.txt && chmod 600 /mnt/data/small.txt && "
                "mkdir -p /mnt/data/sub/deeper && ln -s small.txt /mnt/data/link && "
                "sha256sum /mnt/data/big.bin"
            )
        )
        lines = out.stdout.splitlines()
        assert lines[0] == "user 755", lines  # a fresh volume's root: the default user's
        assert lines[1].split()[1] == "ext4"
        digest = lines[2].split()[0]
        # a memory pause and resume: the mount and its data are still there
        snap = await runtime.capture(vm, resume=False, detach=True)
        vm, _ = await runtime.restore(
            snap, private_memory=False, adopt_memory=True, init=init_body("a"), volumes=(image,)
        )
        s = sdk(vm)
        again = await asyncio.to_thread(lambda: s.commands.run("cat /mnt/data/small.txt"))
        assert again.stdout == "hello\n"
        done = await release(vm.host)
        assert done[VOL.path] in ("unmounted",) or str(done[VOL.path]).startswith("frozen")
    finally:
        await runtime.destroy(vm)

    # on the host, without mounting it
    content = VolumeContent(image, tmp_path / "scratch")
    listed = {e["name"]: e for e in await content.list_dir("/")}
    assert {"big.bin", "small.txt", "sub", "link", "lost+found"} <= set(listed)
    assert listed["small.txt"]["mode"] == 0o600 and listed["small.txt"]["size"] == 6
    assert listed["small.txt"]["uid"] == 1000 and listed["sub"]["type"] == "directory"
    assert listed["link"]["type"] == "symlink" and listed["link"]["target"] == "small.txt"
    deep = await content.list_dir("/", depth=3)
    assert "/sub/deeper" in {e["path"] for e in deep}
    copy = await content.read("/big.bin")
    import hashlib

    assert hashlib.sha256(copy.read_bytes()).hexdigest() == digest
    src = tmp_path / "from-api.txt"
    src.write_text("written on the host")
    made = await content.write("/api/new.txt", src, Owner(mode=0o640), force=True)
    assert made["uid"] == 1000 and made["mode"] == 0o640  # its parent's owner

    # a second VM of the same template gets the image in another slot order: found by serial
    vm2, _ = await runtime.restore(
        template, private_memory=False, init=init_body("b"), volumes=(image,)
    )
    try:
        s2 = sdk(vm2)
        got = await asyncio.to_thread(
            lambda: s2.commands.run("cat /mnt/data/api/new.txt; echo; sha256sum /mnt/data/big.bin")
        )
        assert got.stdout.splitlines()[0] == "written on the host"
        assert got.stdout.splitlines()[1].split()[0] == digest
    finally:
        await runtime.destroy(vm2)


async def test_a_capture_without_slots_refuses_volumes(
    runtime: Runtime, template: Snapshot, tmp_path: Path
) -> None:
    import dataclasses

    from workers.node.vmm import BASE_DEVICES, SnapshotIncompatible

    old = dataclasses.replace(
        template, machine=dataclasses.replace(template.machine, devices=BASE_DEVICES)
    )
    with pytest.raises(SnapshotIncompatible, match="volume slots"):
        await runtime.restore(old, volumes=(tmp_path / "img",))
