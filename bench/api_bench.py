"""Control-plane benchmark: E2B `Sandbox.create()` → envd ready, through a real `aenv up`
stack, next to the raw runtime restore (QEMU restore + envd /init, no API, no bus) measured
in the same run on the same host, while the stack is up and idle. The difference is what
the control plane adds.

Run as root: `python -m bench.api_bench [--n 20]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.stats import emit, summary


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def api_creates(n: int, data: Path, raw_state: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The API loop, and the raw restores measured while the same stack is up and idle (so
    both see the same host: its NATS, Postgres and role processes included)."""
    port = _free_port()
    env = {**os.environ, "AENV_SLOT_PREFIX": "aenva", "AENV_NODE_ID": "bench"}
    up = subprocess.run(
        [sys.executable, "-m", "aenv.cli", "up", "--data-dir", str(data), "--port", str(port)],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    if up.returncode != 0:
        raise SystemExit(f"aenv up failed: {up.stderr[-2000:]}")
    info = json.loads((data / "stack.json").read_text())
    os.environ.update({k: info[k] for k in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY")})
    import httpx
    from e2b import Sandbox

    create, first_cmd, kill, pause, resume, snapshot = [], [], [], [], [], []
    http_create: list[float] = []
    http = httpx.Client(base_url=info["E2B_API_URL"], headers={"X-API-KEY": info["E2B_API_KEY"]},
                        timeout=120)  # fmt: skip
    try:
        raw = asyncio.run(raw_restores(n, raw_state))
        Sandbox.create().kill()  # warm-up: connections, template page cache
        for i in range(n):
            # the control plane alone: one keep-alive HTTP client, no SDK objects to build
            t0 = time.monotonic()
            r = http.post("/sandboxes", json={"templateID": "base"})
            http_create.append(time.monotonic() - t0)
            r.raise_for_status()
            http.delete(f"/sandboxes/{r.json()['sandboxID']}")
            time.sleep(0.3)
            t0 = time.monotonic()
            sbx = Sandbox.create()
            create.append(time.monotonic() - t0)
            t0 = time.monotonic()
            sbx.commands.run("true")
            first_cmd.append(time.monotonic() - t0)
            t0 = time.monotonic()
            sbx.pause()
            pause.append(time.monotonic() - t0)
            t0 = time.monotonic()
            sbx = Sandbox.connect(sbx.sandbox_id)  # resume: answers once envd is ready
            resume.append(time.monotonic() - t0)
            if i < max(3, n // 4):  # persistent snapshots: fewer (each keeps a template)
                t0 = time.monotonic()
                sbx.create_snapshot(name=f"bench-{i}")
                snapshot.append(time.monotonic() - t0)
                Sandbox.delete_snapshot(f"bench-{i}")
            t0 = time.monotonic()
            sbx.kill()
            kill.append(time.monotonic() - t0)
    finally:
        http.close()
        subprocess.run([sys.executable, "-m", "aenv.cli", "down", "--data-dir", str(data)],
                       capture_output=True, timeout=120)  # fmt: skip
    api = {"create": create, "first_command": first_cmd, "kill": kill, "pause": pause,
           "resume": resume, "snapshot": snapshot, "http_create": http_create}  # fmt: skip
    return api, raw


async def raw_restores(n: int, state: Path) -> dict[str, Any]:
    from workers.node.image import build_base, kernel_cmdline
    from workers.node.runtime import Runtime, init_envd

    image = build_base(progress=lambda m: None)
    rt = await Runtime.open(state, kernel_for_probe=image.kernel, slot_prefix="aenvr")
    same: list[float] = []
    bare: list[float] = []
    pause: list[float] = []
    resume: list[float] = []
    try:
        vm = await rt.boot(kernel=image.kernel, initrd=image.initrd, rootfs=image.rootfs,
                           cmdline=kernel_cmdline(image))  # fmt: skip
        await rt.wait_envd(vm)
        await init_envd(vm.host, None)  # the same warm-up as TemplateCatalog's captures
        snap = await rt.capture(vm, resume=False)
        rt.ram_pool.take(snap.mem)  # start the pool of RAM copies, as the node's does
        await asyncio.sleep(2.0)
        for _ in range(n + 1):
            # The same restore a create does: the sandbox's own RAM file (a copy the pool
            # made off the create path, renamed into place), device state, run, envd /init.
            vm, timing = await rt.restore(snap, private_memory=False)
            same.append(timing.envd)
            # pause and resume as the node does them: capture + release, then adopt the RAM
            t0 = time.monotonic()
            paused = await rt.capture(vm, resume=False, detach=True)
            pause.append(time.monotonic() - t0)
            vm, timing = await rt.restore(paused, private_memory=False, adopt_memory=True)
            resume.append(timing.envd)
            await rt.destroy(vm)
            rt.delete_snapshot(paused)
            # The bare primitive: RAM mapped copy-on-write from the capture (no file at all).
            vm, timing = await rt.restore(snap, private_memory=True)
            bare.append(timing.envd)
            await rt.destroy(vm)
            await asyncio.sleep(0.5)  # what a create's neighbours in the API run leave
        return {"same": same[1:], "bare": bare[1:], "pause": pause[1:], "resume": resume[1:],
                "accel": rt.accel.accel}  # fmt: skip
    finally:
        await rt.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--n", type=int, default=20)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="aenv-apibench-", dir="/var/tmp"))
    try:
        api, raw = api_creates(args.n, tmp / "stack", tmp / "raw")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    create, restore = summary(api["create"]), summary(raw["same"])
    resume, raw_resume = summary(api["resume"]), summary(raw["resume"])
    emit("api", {
        "accelerator": raw["accel"],
        "create_to_envd_ready": create,
        "raw_restore_to_envd_ready": restore,
        "control_plane_overhead_ms_p50": round(create["p50"] - restore["p50"], 3),
        "create_via_http_to_envd_ready": summary(api["http_create"]),
        "control_plane_overhead_http_ms_p50": round(
            summary(api["http_create"])["p50"] - restore["p50"], 3),
        "bare_cow_restore_to_envd_ready": summary(raw["bare"]),
        "first_command_through_proxy": summary(api["first_command"]),
        "kill": summary(api["kill"]),
        "pause_via_sdk": summary(api["pause"]),
        "raw_pause_capture_and_release": summary(raw["pause"]),
        "resume_via_sdk_to_envd_ready": resume,
        "raw_resume_to_envd_ready": raw_resume,
        "resume_overhead_ms_p50": round(resume["p50"] - raw_resume["p50"], 3),
        "persistent_snapshot_via_sdk": summary(api["snapshot"]),
    })  # fmt: skip


if __name__ == "__main__":
    main()
