"""microVM runtime benchmark: boot, snapshot, restore, fork, memory per child.

Every runtime figure sits next to the raw VMM primitive measured in the same run (QEMU
launched straight on a prepared overlay and slot, with no runtime bookkeeping), so the
ratio shows what the runtime adds. Run as root: `python -m bench.runtime_bench`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.stats import emit, ratio, summary
from workers.node.image import build_base, kernel_cmdline
from workers.node.runtime import Runtime, Snapshot, Vm, init_envd, wait_envd
from workers.node.runtime.guest import ENVD_PORT, http_request
from workers.node.runtime.memfile import clone_or_sparse_copy
from workers.node.usage import read_smaps
from workers.node.vmm import Incoming, LaunchSpec, QemuVm


def pss_kib(pid: int) -> int:
    """A process's PSS (KiB); 0 once it is gone."""
    m = read_smaps(pid)
    return m.pss // 1024 if m is not None else 0


async def raw_restore(rt: Runtime, snap: Snapshot, workdir: Path) -> tuple[float, float]:
    """The bare primitive: QEMU + migrate-incoming + cont on a ready slot and overlay."""
    slot = await rt.pool.acquire()
    top = await rt.layers.create_top(snap.disk_top)
    spec = LaunchSpec(
        vm_id="raw",
        machine=snap.machine,
        workdir=workdir,
        mem_file=snap.mem,
        mem_shared=False,
        disk=top,
        runtime_disk=snap.runtime_disk,
        start=Incoming(snap.state),
        netns=slot.netns_path,
    )
    t0 = time.monotonic()
    vm = await QemuVm.launch(spec)
    await vm.cont()
    t_run = time.monotonic() - t0
    await wait_envd(slot.host_reachable_ip, timeout=30)
    t_envd = time.monotonic() - t0
    await vm.kill()
    await rt.pool.release(slot)
    top.unlink()
    return t_run, t_envd


async def main(args: argparse.Namespace) -> dict[str, Any]:
    image = build_base(progress=lambda m: None)
    state = Path(tempfile.mkdtemp(prefix="aenv-bench-", dir="/var/tmp"))
    rt = await Runtime.open(
        state, kernel_for_probe=image.kernel, pool_target=17, slot_prefix="aenvb"
    )
    out: dict[str, Any] = {
        "accelerator": rt.accel.accel,
        "accelerator_reason": rt.accel.reason,
        "qemu": rt.qemu_version,
        "guest_mem_mib": args.mem,
    }
    try:
        boots: list[float] = []
        template: Snapshot | None = None
        for i in range(args.boots):
            t0 = time.monotonic()
            vm = await rt.boot(
                kernel=image.kernel,
                initrd=image.initrd,
                rootfs=image.rootfs,
                cmdline=kernel_cmdline(image),
                mem_mib=args.mem,
            )
            await rt.wait_envd(vm)
            boots.append(time.monotonic() - t0)
            if i == args.boots - 1:
                await init_envd(vm.host, None)  # the warm-up TemplateCatalog does
                template = await rt.capture(vm, resume=False)
            else:
                await rt.destroy(vm)
        assert template is not None
        out["cold_boot_to_envd"] = summary(boots, "s", 1.0)

        raw_run, raw_envd, run, envd = [], [], [], []
        for _ in range(args.restores):
            r1, r2 = await raw_restore(rt, template, state / "raw")
            raw_run.append(r1)
            raw_envd.append(r2)
            vm, timing = await rt.restore(template)
            run.append(timing.running)
            envd.append(timing.envd)
            await rt.destroy(vm)
        out["restore_to_running"] = summary(run)
        out["restore_to_running_raw"] = summary(raw_run)
        out["restore_to_running_ratio"] = ratio(out["restore_to_running"], summary(raw_run))
        out["restore_to_envd"] = summary(envd)
        out["restore_to_envd_raw"] = summary(raw_envd)
        out["restore_to_envd_ratio"] = ratio(out["restore_to_envd"], summary(raw_envd))

        # snapshot of a running VM: stop -> state written (raw) and the full live capture
        parent, _ = await rt.restore(template, private_memory=False)
        raw_snap, live, live_stopped = [], [], []
        for i in range(args.restores):
            t0 = time.monotonic()
            await parent.qemu.stop()
            await parent.qemu.save_state(state / f"raw-state-{i}")
            raw_snap.append(time.monotonic() - t0)
            await parent.qemu.cont()
            t0 = time.monotonic()
            snap = await rt.capture(parent, resume=True)
            live.append(time.monotonic() - t0)
            live_stopped.append(snap.stopped_ms / 1000)
            rt.delete_snapshot(snap)
        out["snapshot_stop_to_state_written"] = summary(raw_snap)
        out["snapshot_live_capture"] = summary(live)
        out["snapshot_live_capture_vm_stopped"] = summary(live_stopped)

        curve: dict[str, Any] = {}
        per_child: list[float] = []
        for n in args.fork_sizes:
            running_s, envd_s, stopped_s, failed = [], [], [], 0
            for rep in range(args.fork_repeats):
                t0 = time.monotonic()
                snap, kids = await rt.fork(parent, n, wait=False)
                vms = [k for k in kids if isinstance(k, Vm)]
                running_s.append(time.monotonic() - t0)
                stopped_s.append(snap.stopped_ms / 1000)
                await asyncio.gather(*(rt.wait_envd(k, 120) for k in vms))
                envd_s.append(time.monotonic() - t0)
                failed += n - len(vms)
                if n == max(args.fork_sizes) and rep == 0:
                    await asyncio.sleep(args.idle)
                    per_child = [pss_kib(k.qemu.pid) / 1024 for k in vms if k.qemu.pid]
                await asyncio.gather(*(rt.destroy(k) for k in vms))
                rt.delete_snapshot(snap)
            curve[str(n)] = {
                "all_running": summary(running_s, "s", 1.0),
                "all_envd": summary(envd_s, "s", 1.0),
                "parent_stopped": summary(stopped_s),
                "failed": failed,
            }
        out["fork_curve"] = curve
        if per_child:
            mean = sum(per_child) / len(per_child)
            out["idle_child_pss_mib"] = round(mean, 1)
            out["idle_child_pss_over_guest_ram"] = round(mean / args.mem, 3)
        await rt.destroy(parent)

        if args.density_children:
            out["density"] = await density(rt, image, args)

        # pause (= capture and release the VM) must not grow with guest RAM
        for mem in args.pause_sizes:
            vm = await rt.boot(
                kernel=image.kernel,
                initrd=image.initrd,
                rootfs=image.rootfs,
                cmdline=kernel_cmdline(image),
                mem_mib=mem,
            )
            await rt.wait_envd(vm)
            await init_envd(vm.host, None)
            tpl = await rt.capture(vm, resume=False)
            raw_pause, pause, resume, copy = [], [], [], []
            for i in range(args.pauses):
                sbx, _ = await rt.restore(tpl, private_memory=False)
                t0 = time.monotonic()
                await sbx.qemu.stop()
                await sbx.qemu.save_state(state / f"raw-pause-{mem}-{i}")
                raw_pause.append(time.monotonic() - t0)
                await sbx.qemu.cont()
                t0 = time.monotonic()
                snap = await rt.capture(sbx, resume=False, detach=True)  # what a pause does
                pause.append(time.monotonic() - t0)
                # the resume of a pause: adopts the RAM file, and copies it for the capture
                # while QEMU starts (the capture stays whole until the resume is recorded);
                # the copy alone, beside it, says how much of it QEMU's start hides
                t0 = time.monotonic()
                clone_or_sparse_copy(snap.mem, state / "copy-probe")
                copy.append(time.monotonic() - t0)
                (state / "copy-probe").unlink()
                sbx2, timing = await rt.restore(snap, private_memory=False, adopt_memory=True)
                resume.append(timing.running)
                await rt.destroy(sbx2)  # (the resume also proves the pause was complete)
                rt.delete_snapshot(snap)
            out[f"pause_{mem}mib"] = summary(pause)
            out[f"pause_{mem}mib_raw_stop_and_state"] = summary(raw_pause)
            out[f"pause_{mem}mib_ratio"] = ratio(summary(pause), summary(raw_pause))
            out[f"resume_{mem}mib_to_running"] = summary(resume)
            out[f"resume_{mem}mib_capture_copy_alone"] = summary(copy)
            if "restore_to_running_raw" in out:
                out[f"resume_{mem}mib_ratio_to_raw_restore"] = ratio(
                    summary(resume), out["restore_to_running_raw"]
                )
            if args.fs_pauses:
                out.update(await fs_pause(rt, tpl, mem, args.fs_pauses, out))
            rt.delete_snapshot(tpl)
    finally:
        await rt.close()
        with contextlib.suppress(OSError):
            shutil.rmtree(state)
    return out


async def fs_pause(
    rt: Runtime, tpl: Snapshot, mem: int, n: int, out: dict[str, Any]
) -> dict[str, Any]:
    """E2B's filesystem-only pause beside the memory pause: the guest flushes (envd
    /sync), only its disk is kept, and the resume is a cold boot of that disk, so it is
    set against this run's cold boot rather than a restore. Its size does not depend on
    guest RAM: that is what it is for."""
    pause, resume, disk = [], [], []
    for i in range(n):
        sbx, _ = await rt.restore(tpl, private_memory=False)
        t0 = time.monotonic()
        _, body = await http_request(sbx.host, ENVD_PORT, "GET", "/defaults", timeout=10.0)
        status, _ = await http_request(sbx.host, ENVD_PORT, "POST", "/sync", timeout=60.0)
        assert status == 200, f"envd /sync answered {status}"
        snap = await rt.capture_disk(
            sbx, snapshot_id=f"fs-{mem}-{i}", guest_defaults=json.loads(body)
        )
        pause.append(time.monotonic() - t0)
        disk.append(snap.disk_top.stat().st_blocks * 512 / 2**20)  # what it keeps
        vm, timing = await rt.boot_disk(snap, vm_id=f"fs-{mem}-{i}")
        resume.append(timing.envd)
        await rt.destroy(vm)
        rt.delete_snapshot(snap)
    res: dict[str, Any] = {
        f"fs_pause_{mem}mib": summary(pause),
        f"fs_pause_{mem}mib_capture_mib": summary(disk, "MiB", 1.0),
        f"fs_resume_{mem}mib_to_envd": summary(resume, "s", 1.0),
    }
    if "cold_boot_to_envd" in out:
        res[f"fs_resume_{mem}mib_ratio_to_cold_boot"] = ratio(
            res[f"fs_resume_{mem}mib_to_envd"], out["cold_boot_to_envd"]
        )
    return res


def mem_available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def density(rt: Runtime, image: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Issue 5: nominal ÷ used host RAM for N idle fork children of a big template.

    Nominal = N x guest RAM. Used is given two ways: the children's summed PSS (each shared
    page counted once across them), and the drop of the host's MemAvailable from before the
    fork to after the idle wait (everything the fork cost the host, page cache included;
    noisier, since other processes move it too)."""
    mem, n = args.density_mem, args.density_children
    vm = await rt.boot(
        kernel=image.kernel,
        initrd=image.initrd,
        rootfs=image.rootfs,
        cmdline=kernel_cmdline(image),
        mem_mib=mem,
    )
    await rt.wait_envd(vm)
    await init_envd(vm.host, None)
    tpl = await rt.capture(vm, resume=False)
    parent, _ = await rt.restore(tpl, private_memory=False)
    try:
        await asyncio.sleep(1.0)
        before = mem_available_mib()
        snap, kids = await rt.fork(parent, n, wait=True)
        vms = [k for k in kids if isinstance(k, Vm)]
        await asyncio.sleep(args.idle)
        pss = [pss_kib(k.qemu.pid) / 1024 for k in vms if k.qemu.pid]
        drop = max(before - mem_available_mib(), 1.0)
        nominal = len(vms) * mem
        await asyncio.gather(*(rt.destroy(k) for k in vms))
        rt.delete_snapshot(snap)
    finally:
        await rt.destroy(parent)
        rt.delete_snapshot(tpl)
    return {
        "guest_mem_mib": mem,
        "children": len(vms),
        "nominal_mib": nominal,
        "children_pss_sum_mib": round(sum(pss), 1),
        "nominal_over_used_pss": round(nominal / max(sum(pss), 1.0), 1),
        "host_memavailable_drop_mib": round(drop, 1),
        "nominal_over_used_memavailable": round(nominal / drop, 1),
    }


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--boots", type=int, default=2)
    p.add_argument("--restores", type=int, default=10)
    p.add_argument("--mem", type=int, default=512, help="guest RAM, MiB")
    p.add_argument("--fork-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--fork-repeats", type=int, default=3)
    p.add_argument("--idle", type=float, default=5.0, help="seconds before measuring PSS")
    p.add_argument("--density-mem", type=int, default=1024, help="template RAM, MiB")
    p.add_argument("--density-children", type=int, default=16, help="0 skips it")
    p.add_argument("--pause-sizes", type=int, nargs="*", default=[256, 2048], help="MiB")
    p.add_argument("--pauses", type=int, default=10)
    p.add_argument("--fs-pauses", type=int, default=3, help="0 skips them")
    emit("runtime", asyncio.run(main(p.parse_args())))


if __name__ == "__main__":
    cli()
