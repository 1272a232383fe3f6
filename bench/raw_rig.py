"""The raw side of the api bench: the node's restore path without the control plane (the
same runtime calls, no API, no bus), in a process of its own.

Its own process, not a thread of the bench: the bench's E2B and HTTP clients measure the
control plane from the client's side, and a runtime sharing their interpreter (its event
loop, its RAM-pool refills, its QMP traffic) took the GIL from them at random moments —
seen as 15 → 34 ms swings of the measured overhead between runs of the same code.

Protocol on stdin/stdout, one JSON object a line: the rig prints `{"accel": ...}` once it
is ready; each `cycle` line it reads is answered with one cycle's timings (seconds);
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
            elif line in ("close", ""):
                return
            else:
                print(f"raw_rig: unknown request {line!r}", file=sys.stderr)
    finally:
        await rig.rt.close()


if __name__ == "__main__":
    asyncio.run(serve(Path(sys.argv[1])))
