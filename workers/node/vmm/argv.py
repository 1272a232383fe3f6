"""Pure construction of the QEMU command line for a `LaunchSpec`.

One function so boot and restore can never drift apart in device layout: a restore whose
devices differ from the snapshotting VM's fails inside QEMU in ways that are hard to read.
"""

from __future__ import annotations

from workers.node.vmm.spec import (
    BALLOON,
    VOLUME_BYTES,
    VOLUME_SERIAL,
    Boot,
    Incoming,
    LaunchSpec,
)

QEMU_BINARY = "qemu-system-x86_64"
#: What a writable drive does on a failed write: a host out of space stops the VM (QEMU
#: keeps the write and retries it on `cont`; `workers/node/diskwatch.py` makes room or ends
#: the sandbox), any other write error and every read error goes to the guest as an I/O
#: error. QEMU's defaults say the same; spelled out so a changed default cannot turn a full
#: host into corrupted guests or into VMs that stop with nobody watching.
WRITE_ERRORS = "werror=enospc,rerror=report"
#: A read-only drive only reads: its errors go to the guest.
READ_ERRORS = "rerror=report"


def qemu_argv(spec: LaunchSpec, binary: str = QEMU_BINARY) -> list[str]:
    m = spec.machine
    share = "on" if spec.mem_shared else "off"
    argv = [
        binary,
        "-name",
        spec.vm_id,
        "-machine",
        f"{m.machine},memory-backend=mem",
        "-accel",
        m.accel,
        "-cpu",
        m.cpu,
        "-smp",
        str(m.vcpus),
        "-m",
        f"{m.mem_mib}M",
        "-object",
        f"memory-backend-file,id=mem,size={m.mem_mib}M,mem-path={spec.mem_file},share={share}",
        "-nodefaults",
        "-no-user-config",
        "-no-reboot",
        "-display",
        "none",
        "-serial",
        f"file:{spec.console_log}",
        "-qmp",
        f"unix:{spec.qmp_socket},server=on,wait=off",
        "-drive",
        f"id=root,file={spec.disk},format=qcow2,if=none,discard=unmap,cache=writeback,"
        + WRITE_ERRORS,
        "-device",
        "virtio-blk-device,drive=root",
        "-drive",
        f"id=rt,file={spec.runtime_disk},format=raw,if=none,readonly=on,{READ_ERRORS}",
        "-device",
        "virtio-blk-device,drive=rt",
        "-netdev",
        f"tap,id=n0,ifname={spec.tap},script=no,downscript=no",
        "-device",
        f"virtio-net-device,netdev=n0,mac={m.guest_mac}",
    ]
    argv += volume_slots(spec)
    if m.balloon:  # after every other device: older layouts keep their slots
        argv += ["-device", f"{BALLOON},free-page-reporting=on"]
    if isinstance(spec.start, Boot):
        argv += ["-kernel", str(spec.start.kernel), "-initrd", str(spec.start.initrd)]
        argv += ["-append", spec.start.cmdline]
    elif isinstance(spec.start, Incoming):
        argv += ["-incoming", "defer"]
    argv += list(spec.extra_args)
    # spec.netns is entered by the launcher (setns in the child before exec), not by an
    # `nsenter` exec: one process start less per VM on the restore/fork path.
    return argv


def volume_slots(spec: LaunchSpec) -> list[str]:
    """The machine's volume slots, after every other device (a capture taken before volumes
    existed has none, and its devices must stay as they were). A slot without a volume is
    a `null-co` drive of the same size: no file, it reads zeros and drops writes, so a
    guest writing its placeholder leaks nothing to the next VM. A volume's image is a raw
    sparse file; zero writes and discards punch holes in it (the guest mounts with discard),
    so a file deleted in the guest is space freed on the host and chunks never uploaded."""
    slots = spec.machine.volume_slots
    if len(spec.volumes) > slots:
        raise ValueError(f"{len(spec.volumes)} volumes for a machine with {slots} volume slots")
    out: list[str] = []
    for i in range(slots):
        image = spec.volumes[i] if i < len(spec.volumes) else None
        if image is None:
            drive = f"id=vol{i},driver=null-co,size={VOLUME_BYTES},read-zeroes=on,if=none"
        else:
            drive = (
                f"id=vol{i},file={image},format=raw,if=none,cache=writeback,"
                f"discard=unmap,detect-zeroes=unmap,{WRITE_ERRORS}"
            )
        out += [
            "-drive",
            drive,
            "-device",
            f"virtio-blk-device,drive=vol{i},serial={VOLUME_SERIAL.format(i)}",
        ]
    return out
