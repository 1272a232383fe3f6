"""The balloon in a machine's devices (`AENV_BALLOON`): its QEMU device after every other,
captures restoring with the devices they were taken with, and the ramkeep shim preloaded
exactly where a VM's freed pages could otherwise punch holes in a shared capture."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.unit.node.test_argv import machine, opt, spec
from workers.node.runtime.compat import check_compatible
from workers.node.runtime.snapshot import Snapshot
from workers.node.vmm import (
    BALLOON_DEVICES,
    BASE_DEVICES,
    DEVICES,
    VOLUME_SLOTS,
    Incoming,
    SnapshotIncompatible,
    VmmError,
    qemu_argv,
    ramkeep,
)

BALLOON = "virtio-balloon-device,free-page-reporting=on"


def _snap(tmp_path: Path, devices: tuple[str, ...]) -> Snapshot:
    for name in ("state", "mem", "disk.qcow2"):
        (tmp_path / name).write_bytes(b"x")
    return Snapshot(
        snapshot_id="s1",
        dir=tmp_path,
        machine=machine(devices=devices),
        disk_top=tmp_path / "disk.qcow2",
        base_image=tmp_path / "base",
        runtime_disk=tmp_path / "rt",
    )


def test_the_balloon_comes_after_the_volume_slots_which_keep_their_count() -> None:
    with_balloon = machine(devices=BALLOON_DEVICES)
    assert with_balloon.balloon and not machine().balloon
    assert with_balloon.volume_slots == VOLUME_SLOTS
    devices = opt(
        qemu_argv(dataclasses.replace(spec(Incoming(Path("/s"))), machine=with_balloon)), "-device"
    )
    without = opt(qemu_argv(spec(Incoming(Path("/s")))), "-device")
    assert devices == [*without, BALLOON]
    assert BALLOON not in without
    assert with_balloon.fingerprint() != machine().fingerprint()  # templates captured again


@pytest.mark.parametrize("taken_with", [BASE_DEVICES, DEVICES, BALLOON_DEVICES])
@pytest.mark.parametrize("here", [DEVICES, BALLOON_DEVICES])
def test_a_capture_restores_with_the_devices_it_was_taken_with(
    tmp_path: Path, taken_with: tuple[str, ...], here: tuple[str, ...]
) -> None:
    check_compatible(machine(devices=here), _snap(tmp_path, taken_with))


def test_a_capture_of_an_unknown_layout_is_refused(tmp_path: Path) -> None:
    odd = (*DEVICES, "virtio-rng-device")
    with pytest.raises(SnapshotIncompatible, match="devices"):
        check_compatible(machine(devices=BALLOON_DEVICES), _snap(tmp_path, odd))


def test_the_shim_guards_only_a_balloon_vm_over_a_private_mapping(tmp_path: Path) -> None:
    shim = tmp_path / "ramkeep.so"
    private = dataclasses.replace(
        spec(Incoming(Path("/s")), shared=False),
        machine=machine(devices=BALLOON_DEVICES),
        ram_keep=shim,
    )
    env = ramkeep.qemu_env(private)
    assert env is not None
    assert env["LD_PRELOAD"].split()[0] == str(shim)
    assert env[ramkeep.KEEP_ENV] == str(private.mem_file)
    # its own RAM file (a create, a resume): the balloon's holes there are the point
    assert ramkeep.qemu_env(dataclasses.replace(private, mem_shared=True)) is None
    # no balloon: nothing to guard
    assert ramkeep.qemu_env(spec(Incoming(Path("/s")), shared=False)) is None
    with pytest.raises(VmmError, match="ramkeep"):
        ramkeep.qemu_env(dataclasses.replace(private, ram_keep=None))  # never run unguarded


def test_the_shim_builds_once_per_source(tmp_path: Path) -> None:
    built = ramkeep.build(tmp_path)
    if built is None:
        pytest.skip("no C compiler on this host")
    assert built.exists() and ramkeep.build(tmp_path) == built
