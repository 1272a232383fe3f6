from dataclasses import replace
from pathlib import Path

import pytest

from workers.node.vmm import (
    BASE_DEVICES,
    VOLUME_BYTES,
    VOLUME_SLOTS,
    Boot,
    Incoming,
    LaunchSpec,
    Machine,
    qemu_argv,
)


def machine(**kw: object) -> Machine:
    base: dict[str, object] = dict(
        qemu_version="7.2.22",
        accel="tcg",
        cpu="max",
        vcpus=1,
        mem_mib=256,
        guest_mac="06:00:ac:10:00:02",
    )
    base.update(kw)
    return Machine(**base)  # type: ignore[arg-type]


def spec(
    start: Boot | Incoming, shared: bool = True, netns: str | None = "/run/netns/x"
) -> LaunchSpec:
    return LaunchSpec(
        vm_id="vm1",
        machine=machine(),
        workdir=Path("/w"),
        mem_file=Path("/w/mem"),
        mem_shared=shared,
        disk=Path("/l/top.qcow2"),
        runtime_disk=Path("/rt/runtime.ext4"),
        start=start,
        netns=netns,
    )


def opt(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_boot_and_restore_share_the_device_layout() -> None:
    boot = qemu_argv(spec(Boot(Path("/k"), Path("/i"), "console=ttyS0")))
    restore = qemu_argv(spec(Incoming(Path("/s/state")), shared=False))
    for flag in ("-machine", "-device", "-netdev", "-drive", "-smp", "-m", "-cpu", "-accel"):
        assert opt(boot, flag) == opt(restore, flag), flag
    assert "-incoming" not in boot and opt(restore, "-incoming") == ["defer"]
    assert opt(boot, "-kernel") == ["/k"] and "-kernel" not in restore


def test_memory_backend_sharing_follows_the_spec() -> None:
    shared = opt(qemu_argv(spec(Incoming(Path("/s")), shared=True)), "-object")[0]
    private = opt(qemu_argv(spec(Incoming(Path("/s")), shared=False)), "-object")[0]
    assert "share=on" in shared and "mem-path=/w/mem" in shared
    assert "share=off" in private


def test_qemu_is_exec_d_directly_whatever_the_netns() -> None:
    # the launcher enters the namespace with setns before exec: no wrapper process
    argv = qemu_argv(spec(Incoming(Path("/s"))))
    assert argv[0] == "qemu-system-x86_64" and "nsenter" not in argv
    assert qemu_argv(spec(Incoming(Path("/s")), netns=None)) == argv


def test_machine_fingerprint_changes_with_guest_visible_hardware() -> None:
    a = machine()
    assert a.fingerprint() == machine().fingerprint()
    assert a.fingerprint() != machine(qemu_version="8.2.0").fingerprint()
    assert a.fingerprint() != machine(mem_mib=512).fingerprint()


def test_mismatch_names_each_difference() -> None:
    diff = machine().mismatch(machine(qemu_version="8.2.0", accel="kvm"))
    assert len(diff) == 2
    assert any("qemu_version" in d and "8.2.0" in d for d in diff)
    assert any(d.startswith("accel") for d in diff)


@pytest.mark.parametrize("vcpus", [1, 2, 4])
def test_smp_matches_vcpus(vcpus: int) -> None:
    s = LaunchSpec(
        vm_id="v",
        machine=machine(vcpus=vcpus),
        workdir=Path("/w"),
        mem_file=Path("/m"),
        mem_shared=True,
        disk=Path("/d"),
        runtime_disk=Path("/rt"),
        start=Incoming(Path("/s")),
    )
    assert opt(qemu_argv(s), "-smp") == [str(vcpus)]


def test_every_vm_has_volume_slots_with_placeholders_after_its_other_devices() -> None:
    argv = qemu_argv(spec(Boot(Path("/k"), Path("/i"), "console=ttyS0")))
    devices = opt(argv, "-device")
    assert len(devices) == 3 + VOLUME_SLOTS
    assert devices[3:] == [
        f"virtio-blk-device,drive=vol{i},serial=aenv-vol{i}" for i in range(VOLUME_SLOTS)
    ]
    drives = opt(argv, "-drive")[2:]
    assert all("driver=null-co" in d and f"size={VOLUME_BYTES}" in d for d in drives)


def test_a_restore_gives_a_slot_the_volumes_image_with_the_same_devices() -> None:
    base = spec(Incoming(Path("/s")))
    with_volume = replace(base, volumes=(None, Path("/v/img")))
    a, b = qemu_argv(base), qemu_argv(with_volume)
    assert opt(a, "-device") == opt(b, "-device")
    drive = opt(b, "-drive")[3]
    assert drive.startswith("id=vol1,file=/v/img,format=raw") and "discard=unmap" in drive
    assert "null-co" in opt(b, "-drive")[2]


def test_a_machine_from_before_volumes_keeps_its_devices() -> None:
    old = machine(devices=BASE_DEVICES)
    assert old.volume_slots == 0 and machine().volume_slots == VOLUME_SLOTS
    argv = qemu_argv(replace(spec(Incoming(Path("/s"))), machine=old))
    assert len(opt(argv, "-device")) == 3
    with pytest.raises(ValueError, match="volume slots"):
        qemu_argv(replace(spec(Incoming(Path("/s"))), machine=old, volumes=(Path("/v"),)))
    # and its fingerprint is not the new machine's: built templates are captured again
    assert old.fingerprint() != machine().fingerprint()


def test_writable_drives_stop_on_a_full_host_and_report_other_errors() -> None:
    # a full host must stop the VM for the disk watch, never corrupt the guest's disk
    drives = opt(qemu_argv(spec(Incoming(Path("/s")))), "-drive")
    root = next(d for d in drives if d.startswith("id=root,"))
    rt = next(d for d in drives if d.startswith("id=rt,"))
    assert "werror=enospc" in root and "rerror=report" in root
    assert "rerror=report" in rt and "werror" not in rt
    used = replace(spec(Incoming(Path("/s"))), volumes=(Path("/v/a.img"),))
    vol = next(d for d in opt(qemu_argv(used), "-drive") if d.startswith("id=vol0,"))
    assert "werror=enospc" in vol and "rerror=report" in vol
