"""The raw side of the api bench: the node's restore path without the control plane (the
same runtime calls, no API, no bus), in a process of its own.

Its own process, not a thread of the bench: the bench's E2B and HTTP clients measure the
control plane from the client's side, and a runtime sharing their interpreter (its event
loop, its RAM-pool refills, its QMP traffic) took the GIL from them at random moments —
seen as 15 → 34 ms swings of the measured overhead between runs of the same code.

Protocol on stdin/stdout, one JSON object a line: the rig prints `{"accel": ...}` once it
is ready; each `cycle` line it reads is answered with one cycle's timings (seconds),
`warm` with the warm pool's hand-over, `dirty <MiB>` with a pause of a guest that wrote
that much without a sync (`RawRig.dirty`), `memory <s>` with the memory of a create-like
VM and of a bare copy-on-write restore idle that long (`RawRig.memory`);
`close` (or end of input) shuts it down. Progress and logs go to stderr.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from workers.node.image import build_base, kernel_cmdline
from workers.node.runtime import Runtime, init_envd, run_first_command
from workers.node.usage import read_smaps

#: a guest command writing this long is not stuck (256 MiB of /dev/urandom under TCG: ~10 s)
WRITE_TIMEOUT_S = 600.0


def write_command(mib: int, path: str = "/home/user/dirty") -> str:
    """A shell line that writes `mib` MiB of random bytes to `path` and does not sync:
    the pages stay dirty in the guest's page cache (random, so no layer below can skip
    them as zeros or dedupe them)."""
    return f"rm -f {path}; head -c {mib}M /dev/urandom > {path}"


class RawRig:
    """A runtime with the base template captured, cycling restores like the node's."""

    def __init__(self, rt: Runtime, snap: Any) -> None:
        self.rt = rt
        self.snap = snap

    @classmethod
    async def open(cls, state: Path) -> RawRig:
        image = build_base(progress=lambda m: print(m, file=sys.stderr))
        rt = await Runtime.open(state, kernel_for_probe=image.kernel, slot_prefix="aenvr")
        vm = await rt.boot(
            kernel=image.kernel,
            initrd=image.initrd,
            rootfs=image.rootfs,
            cmdline=kernel_cmdline(image),
        )
        await rt.wait_envd(vm)
        await init_envd(vm.host, None)  # the same warm-up as TemplateCatalog's captures
        snap = await rt.capture(vm, resume=False)
        rt.ram_pool.take(snap.mem)  # start the pool of RAM copies, as the node's does
        await asyncio.sleep(2.0)
        return cls(rt, snap)

    async def cycle(self) -> dict[str, float]:
        """One create-like restore, a pause and resume of it, and the bare primitive."""
        rt = self.rt
        # The same restore a create does: the sandbox's own RAM file (a copy the pool made
        # off the create path, renamed into place), device state, run, envd /init.
        vm, timing = await rt.restore(self.snap, private_memory=False)
        out = {"same": timing.envd}
        await asyncio.sleep(0.3)
        # pause and resume as the node does them: capture + release, then adopt the RAM
        t0 = time.monotonic()
        paused = await rt.capture(vm, resume=False, detach=True)
        out["pause"] = time.monotonic() - t0
        vm, timing = await rt.restore(paused, private_memory=False, adopt_memory=True)
        out["resume"] = timing.envd
        await rt.destroy(vm)
        rt.delete_snapshot(paused)
        # The bare primitive: RAM mapped copy-on-write from the capture (no file at all).
        vm, timing = await rt.restore(self.snap, private_memory=True)
        out["bare"] = timing.envd
        await rt.destroy(vm)
        return out

    async def dirty(self, mib: int) -> dict[str, float]:
        """A create-like VM whose guest wrote `mib` MiB to a file, not synced (0: idle),
        then: QEMU's stop + device state written (the raw primitive; `cont` after it),
        the runtime's pause (a capture that releases the VM, as the node's pause), the
        resume of that capture (its RAM file adopted) until the VM runs and envd answers,
        and — after the same write again — the runtime's live capture (the VM work of a
        `create_snapshot`: the VM runs on after it)."""
        rt = self.rt
        vm, _ = await rt.restore(self.snap, private_memory=False)
        out: dict[str, float] = {}
        try:
            await _written(vm, mib)
            t0 = time.monotonic()
            await vm.qemu.stop()
            await vm.qemu.save_state(vm.dir / "raw-state")
            out["stop_and_state"] = time.monotonic() - t0
            await vm.qemu.cont()
            (vm.dir / "raw-state").unlink()
            t0 = time.monotonic()
            paused = await rt.capture(vm, resume=False, detach=True)
            out["pause"] = time.monotonic() - t0
        except BaseException:
            await rt.destroy(vm)
            raise
        vm, timing = await rt.restore(paused, private_memory=False, adopt_memory=True)
        out["resume_running"], out["resume_envd"] = timing.running, timing.envd
        try:
            await _written(vm, mib)
            t0 = time.monotonic()
            live = await rt.capture(vm, resume=True)
            out["live_capture"] = time.monotonic() - t0
            out["live_capture_vm_stopped"] = live.stopped_ms / 1000
            rt.delete_snapshot(live)
        finally:
            await rt.destroy(vm)
            rt.delete_snapshot(paused)
        return out

    async def memory(self, idle_s: float) -> dict[str, float]:
        """The memory (bytes, `usage.Smaps`) of a VM restored as a create restores one (its
        own RAM file) and of the bare primitive, the capture's RAM mapped copy-on-write
        (what fork children do), both idle `idle_s` with envd initialised."""
        rt = self.rt
        own, _ = await rt.restore(self.snap, private_memory=False)
        bare, _ = await rt.restore(self.snap, private_memory=True)
        try:
            await asyncio.sleep(idle_s)
            out: dict[str, float] = {}
            for name, vm in (("create_like", own), ("bare_cow", bare)):
                m = read_smaps(vm.qemu.pid) if vm.qemu.pid else None
                if m is not None:
                    out |= {f"{name}_{k}": float(getattr(m, k)) for k in ("rss", "pss")}
                    out |= {f"{name}_{k}": float(getattr(m, k)) for k in ("shared", "private")}
            out["guest_mem_bytes"] = float(self.snap.machine.mem_mib << 20)
            return out
        finally:
            await rt.destroy(own)
            await rt.destroy(bare)

    async def warm(self) -> dict[str, float]:
        """The warm pool's primitive: a VM restored, its first command run, its vCPUs
        stopped (off the clock), then handed over — `cont` and envd's /init — on the clock;
        and that VM's first command after the hand-over."""
        rt = self.rt
        vm, _ = await rt.restore(
            self.snap, private_memory=False, background=True, init={"accessToken": "rig"}
        )
        try:
            await run_first_command(vm.host, token="rig")
            await vm.qemu.stop()
            await asyncio.sleep(0.3)
            t0 = time.monotonic()
            vm.qemu.set_background(False)
            await vm.qemu.cont()
            await init_envd(vm.host, {"accessToken": "rig2"}, token="rig")
            handover = time.monotonic() - t0
            t0 = time.monotonic()
            await run_first_command(vm.host, token="rig2", argv=("/bin/bash", "-l", "-c", "true"))
            return {"handover": handover, "first_command": time.monotonic() - t0}
        finally:
            await rt.destroy(vm)


async def serve(state: Path) -> None:
    rig = await RawRig.open(state)
    loop = asyncio.get_running_loop()
    try:
        print(json.dumps({"accel": rig.rt.accel.accel}), flush=True)
        while True:
            line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
            if line == "cycle":
                print(json.dumps(await rig.cycle()), flush=True)
            elif line == "warm":
                print(json.dumps(await rig.warm()), flush=True)
            elif line.startswith("dirty "):
                print(json.dumps(await rig.dirty(int(line.split()[1]))), flush=True)
            elif line.startswith("memory "):
                print(json.dumps(await rig.memory(float(line.split()[1]))), flush=True)
            elif line in ("close", ""):
                return
            else:
                print(f"raw_rig: unknown request {line!r}", file=sys.stderr)
    finally:
        await rig.rt.close()


if __name__ == "__main__":
    asyncio.run(serve(Path(sys.argv[1])))


async def _written(vm: Any, mib: int) -> None:
    """`mib` MiB written in the guest without a sync (none: nothing), then a moment idle."""
    if mib:
        argv = ("/bin/sh", "-c", write_command(mib))
        await run_first_command(vm.host, token=None, timeout=WRITE_TIMEOUT_S, argv=argv)
    await asyncio.sleep(0.3)
