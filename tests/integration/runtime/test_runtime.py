"""The runtime's promises, on real QEMU microVMs with the real envd and the real e2b SDK."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from tests.integration.runtime.conftest import boot_base, sdk
from workers.node.image import GuestImage
from workers.node.runtime import Runtime, Snapshot, http_request
from workers.node.vmm import SnapshotIncompatible, VmCrashed

pytestmark = pytest.mark.vm


async def run(vm_sdk_host: object, cmd: str) -> str:
    """`commands.run` through the SDK, off the event loop (the sync SDK blocks)."""
    return await asyncio.to_thread(lambda: vm_sdk_host.commands.run(cmd).stdout)  # type: ignore[attr-defined]


async def test_a_capture_records_the_bytes_of_its_disks(template: Snapshot) -> None:
    """The digests a capture records (issue 40) are those of the files it ran over,
    recomputed here from their bytes; a node stacks it only on disks with these."""
    from shared.diskdigest import chunk_list

    assert template.base_content == chunk_list(template.base_image).digest
    assert template.runtime_content == chunk_list(template.runtime_disk).digest
    assert Snapshot.read(template.dir).base_content == template.base_content


async def test_template_boot_reports_accelerator(runtime: Runtime, template: Snapshot) -> None:
    assert runtime.accel.accel in ("kvm", "tcg") and runtime.accel.reason
    assert template.machine.accel == runtime.accel.accel
    assert template.state.stat().st_size < 4 << 20  # device state only: RAM stays in its file


async def test_two_restores_answer_at_once_and_are_isolated(
    runtime: Runtime, template: Snapshot
) -> None:
    (a, _), (b, _) = await asyncio.gather(runtime.restore(template), runtime.restore(template))
    try:
        assert a.host != b.host
        sa, sb = sdk(a), sdk(b)
        ips = await asyncio.gather(
            run(sa, "ip -4 -o addr show eth0"), run(sb, "ip -4 -o addr show eth0")
        )
        assert "169.254.0.21/30" in ips[0] and "169.254.0.21/30" in ips[1]
        await asyncio.to_thread(sa.files.write, "/home/user/only-in-a.txt", "a")
        assert await asyncio.to_thread(sa.files.exists, "/home/user/only-in-a.txt")
        assert not await asyncio.to_thread(sb.files.exists, "/home/user/only-in-a.txt")
        # both answer while the other is alive
        assert (await http_request(a.host, 49983, "GET", "/health"))[0] == 204
        assert (await http_request(b.host, 49983, "GET", "/health"))[0] == 204
    finally:
        await asyncio.gather(runtime.destroy(a), runtime.destroy(b))


async def test_fork_children_inherit_files_and_processes(
    runtime: Runtime, template: Snapshot
) -> None:
    parent, _ = await runtime.restore(template, private_memory=False)
    try:
        sp = sdk(parent)
        await asyncio.to_thread(sp.files.write, "/home/user/prefork.txt", "from-parent")
        h = await asyncio.to_thread(
            lambda: sp.commands.run("sleep 100000", background=True, timeout=0)
        )
        snap, children = await runtime.fork(parent, 4)
        try:
            assert all(not isinstance(c, BaseException) for c in children), children
            for i, child in enumerate(children):
                assert not isinstance(child, BaseException)
                sc = sdk(child)
                assert await asyncio.to_thread(sc.files.read, "/home/user/prefork.txt") == (
                    "from-parent"
                )
                pids = [p.pid for p in await asyncio.to_thread(sc.commands.list)]
                assert h.pid in pids, f"child {i} lost the pre-fork process"
                await asyncio.to_thread(sc.files.write, "/home/user/mine.txt", f"child-{i}")
            for i, child in enumerate(children):
                assert not isinstance(child, BaseException)
                got = await asyncio.to_thread(sdk(child).files.read, "/home/user/mine.txt")
                assert got == f"child-{i}"
            # the parent kept running and sees none of the children's writes
            assert not await asyncio.to_thread(sp.files.exists, "/home/user/mine.txt")
            assert h.pid in [p.pid for p in await asyncio.to_thread(sp.commands.list)]
        finally:
            await asyncio.gather(
                *(runtime.destroy(c) for c in children if not isinstance(c, BaseException))
            )
            staged = runtime.ram_stage.staged(snap.mem)  # a fork's capture stays in memory
            runtime.delete_snapshot(snap)
            assert staged is None or not staged.exists()
    finally:
        await runtime.destroy(parent)


async def test_a_live_capture_is_staged_in_memory_then_persisted(
    runtime: Runtime, template: Snapshot
) -> None:
    parent, _ = await runtime.restore(template, private_memory=False)
    try:
        sp = sdk(parent)
        await asyncio.to_thread(sp.files.write, "/home/user/before.txt", "captured")
        snap = await runtime.capture(parent, resume=True)
        try:
            staged = runtime.ram_stage.staged(snap.mem)
            if staged is None:  # a reflink (XFS, btrfs) or no /dev/shm: a file on disk
                assert not snap.mem.is_symlink()
            await asyncio.to_thread(sp.files.write, "/home/user/after.txt", "not captured")
            await runtime.persist(snap)
            assert not snap.mem.is_symlink()
            assert staged is None or not staged.exists()
            child, _ = await runtime.restore(snap)  # from the RAM file now on disk
            try:
                sc = sdk(child)
                assert await asyncio.to_thread(sc.files.read, "/home/user/before.txt") == (
                    "captured"
                )
                assert not await asyncio.to_thread(sc.files.exists, "/home/user/after.txt")
            finally:
                await runtime.destroy(child)
        finally:
            runtime.delete_snapshot(snap)
    finally:
        await runtime.destroy(parent)


async def test_qemu_death_is_reported_fast_with_its_output(
    runtime: Runtime, template: Snapshot
) -> None:
    vm, _ = await runtime.restore(template)
    try:
        assert vm.qemu.pid is not None
        os.kill(vm.qemu.pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(VmCrashed) as exc:
            await vm.qemu.status()
            await asyncio.sleep(0.05)
            await vm.qemu.status()
        assert time.monotonic() - start < 1.0
        assert exc.value.returncode == -signal.SIGKILL
    finally:
        await runtime.destroy(vm)


async def test_restore_refuses_a_snapshot_from_another_machine(
    runtime: Runtime, template: Snapshot, tmp_path: object
) -> None:
    from dataclasses import replace

    alien = replace(template, machine=replace(template.machine, qemu_version="9.9.9"))
    with pytest.raises(SnapshotIncompatible, match="qemu_version"):
        await runtime.restore(alien)


async def test_corrupt_state_fails_cleanly(
    runtime: Runtime, template: Snapshot, guest_image: GuestImage
) -> None:
    vm = await boot_base(runtime, guest_image, mem_mib=256)
    snap = await runtime.capture(vm, resume=False)
    snap.state.write_bytes(b"\x00garbage" * 100)
    before = set(runtime.vms)
    with pytest.raises(VmCrashed):
        await runtime.restore(snap)
    assert set(runtime.vms) == before  # nothing half-restored is left registered
    runtime.delete_snapshot(snap)


async def test_qemu_process_is_capped_and_caps_are_removed(
    runtime: Runtime, template: Snapshot
) -> None:
    from workers.node.vmm import limits

    vm, _ = await runtime.restore(template)
    applied = vm.qemu.cgroup
    try:
        assert applied is not None, "this host has writable cgroups; caps must be applied"
        cap = limits.read_limits(applied)
        assert cap.mem_bytes == (template.machine.mem_mib + 512) << 20
        assert cap.cpus == template.machine.vcpus + 0.5
        for d in applied.dirs:
            assert str(vm.qemu.pid) in (d / "cgroup.procs").read_text().split()
        # under the node's own cgroup (a service's, a pod's): its VMs count against it
        assert limits.placement().inside, limits.placement().reason
        for d, own in zip(applied.dirs, _own_cgroups(), strict=False):
            assert d.parent.parent == own, (d, own)
    finally:
        await runtime.destroy(vm)
    assert all(not d.exists() for d in applied.dirs)


def _own_cgroups() -> list[Path]:
    """This process's cgroup directories: the v2 one, or v1's memory and cpu ones."""
    lines = [ln.split(":", 2) for ln in Path("/proc/self/cgroup").read_text().splitlines()]
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").exists():
        return [root / next(p for _, n, p in lines if n == "").lstrip("/")]
    return [
        root / c / next(p for _, n, p in lines if c in n.split(",")).lstrip("/")
        for c in ("memory", "cpu")
    ]


async def test_a_guest_past_its_cap_is_ended_by_its_own_cgroup_with_an_oom_event(
    runtime: Runtime, template: Snapshot
) -> None:
    """The cap is the VM's own: its QEMU, made to hold more than its cap allows (the cap
    lowered under what the guest then fills of its RAM), is ended by the kernel's OOM
    killer in that cgroup — counted there, so the node reports the cause as `oom` — and
    nothing else on the node is touched."""

    vm, _ = await runtime.restore(template)
    bystander, _ = await runtime.restore(template)
    try:
        applied = vm.qemu.cgroup
        assert applied is not None
        mem = applied.dirs[0]
        used = int(
            (
                mem / ("memory.current" if len(applied.dirs) == 1 else "memory.usage_in_bytes")
            ).read_text()
        )
        cap = used + (48 << 20)
        (mem / ("memory.max" if len(applied.dirs) == 1 else "memory.limit_in_bytes")).write_text(
            str(cap)
        )
        with contextlib.suppress(Exception):  # the VM dies under the command
            await run(sdk(vm), "dd if=/dev/zero of=/dev/shm/fill bs=1M count=200")
        deadline = time.monotonic() + 60
        while vm.qemu.alive and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert not vm.qemu.alive
        assert vm.qemu.oom_killed(), "the VM's own cgroup counted no OOM kill"
        assert (await http_request(bystander.host, 49983, "GET", "/health"))[0] == 204
    finally:
        await asyncio.gather(runtime.destroy(vm), runtime.destroy(bystander))


async def test_guests_reach_neither_the_host_nor_each_other(
    runtime: Runtime, template: Snapshot
) -> None:
    """A listener on the node (bound to the host end of a's own veth, which aenv created)
    answers the node itself but not the guest; guest a cannot dial guest b's address."""
    (a, _), (b, _) = await asyncio.gather(runtime.restore(template), runtime.restore(template))
    host_ip = a.slot.address.host_ip
    server = await asyncio.start_server(lambda r, w: w.close(), host_ip, 0)
    port = server.sockets[0].getsockname()[1]
    try:
        _, w = await asyncio.open_connection(host_ip, port)  # the decoy is really up
        w.close()
        probe = (
            "python3 -c 'import socket,sys\n"
            "try:\n"
            "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2)\n"
            '    print("CONNECTED")\n'
            "except OSError as e:\n"
            '    print("BLOCKED", e)\' '
        )
        sa = sdk(a)
        to_host = await asyncio.to_thread(lambda: sa.commands.run(f"{probe} {host_ip} {port}"))
        assert to_host.stdout.startswith("BLOCKED"), to_host.stdout
        to_b = await asyncio.to_thread(lambda: sa.commands.run(f"{probe} {b.host} 49983"))
        assert to_b.stdout.startswith("BLOCKED"), to_b.stdout
    finally:
        server.close()
        await asyncio.gather(runtime.destroy(a), runtime.destroy(b))


async def test_detached_pause_then_immediate_resume(runtime: Runtime, template: Snapshot) -> None:
    """A pause returns before QEMU has exited; a resume right away waits for that exit
    (the frozen layer is still locked by the old QEMU) and finds the guest as it was."""
    vm, _ = await runtime.restore(template, private_memory=False)
    s = sdk(vm)
    await asyncio.to_thread(s.files.write, "/home/user/before-pause.txt", "kept")
    old_pid = vm.qemu.pid
    snap = await runtime.capture(vm, resume=False, detach=True)
    back, _ = await runtime.restore(snap, private_memory=False, adopt_memory=True)
    try:
        assert old_pid is not None and not Path(f"/proc/{old_pid}").exists()
        got = await asyncio.to_thread(sdk(back).files.read, "/home/user/before-pause.txt")
        assert got == "kept"
    finally:
        await runtime.destroy(back)
        runtime.delete_snapshot(snap)
