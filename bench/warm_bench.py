"""Warm pool benchmark (issue 19), through the unchanged E2B SDK against `aenv up` stacks,
beside the raw primitives measured in the same run by the raw rig (bench/raw_rig.py: the
node's restore, and a warm VM's hand-over — `cont` + envd `/init` — with no API and no bus).

Part 1 (a stack whose pool keeps one VM per template): each round waits until the pool
holds a VM, then creates twice back to back — the first is handed the warm VM (a hit),
the second finds the pool empty and restores (a miss, the cold path) — each followed by
its first `commands.run("echo hi")`; the log's `SandboxCreated.warm` says which was which.
The same for a snapshot template (RL's pattern: snapshot a task's start, create rollouts
from it). The raw rig's restore and hand-over are interleaved with the rounds.

Part 2 (a stack whose pool may grow to 16): a burst of 16 creates primes the demand; once
the pool holds its VMs: their host memory (PSS, from /proc) and the CPU the idle pool
burns over 10 s; then a measured burst of 16 concurrent creates: hit rate, p50/p99.

Run as root: `python -m bench.warm_bench [--n 20]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from aenv.stack.process import free_port
from bench.api_bench import QUIET_S, RigProcess
from bench.stats import emit, ratio, summary
from workers.node.usage import read_smaps

BURST = 16
IDLE_WINDOW_S = 10.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


class BenchStack:
    """An `aenv up` stack of its own (own data dir, slot prefix, node id) until `down`."""

    def __init__(self, data: Path, prefix: str, env: dict[str, str]) -> None:
        self.data = data
        port = free_port()
        full = {
            **os.environ,
            "AENV_SLOT_PREFIX": prefix,
            "AENV_NODE_ID": "bench",
            "AENV_TLS_PORT": str(free_port()),
            **env,
        }
        up = subprocess.run(
            [sys.executable, "-m", "aenv.cli", "up", "--data-dir", str(data), "--port", str(port)],
            capture_output=True,
            text=True,
            env=full,
            timeout=900,
        )
        if up.returncode != 0:
            raise SystemExit(f"aenv up failed: {up.stderr[-2000:]}")
        self.info = json.loads((data / "stack.json").read_text())
        for k in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY"):
            os.environ[k] = self.info[k]

    def down(self) -> None:
        subprocess.run(
            [sys.executable, "-m", "aenv.cli", "down", "--data-dir", str(self.data)],
            capture_output=True,
            timeout=180,
        )

    def warm(self) -> dict[str, int]:
        """The node's pool now (its readiness answer)."""
        import httpx

        from aenv.ops.fleet import read_beats

        (beat,) = asyncio.run(read_beats(str(self.info["nats_url"])))
        return dict(httpx.get(f"http://{beat.proxy}/health/ready", timeout=10).json()["warm"])

    def wait_pool(self, template: str, n: int, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while self.warm().get(template, 0) < n:
            if time.monotonic() > deadline:
                raise SystemExit(f"the pool never held {n} VMs of {template}: {self.warm()}")
            time.sleep(0.2)

    def created_warm(self, sandbox_ids: list[str]) -> dict[str, bool]:
        """Each sandbox's `SandboxCreated.warm`, from the log."""
        from bus import Bus, BusSettings
        from domain import sandbox as sb

        async def read() -> dict[str, bool]:
            bus = await Bus.connect(BusSettings(nats_url=str(self.info["nats_url"])), setup=False)
            try:
                out = {}
                for sid in sandbox_ids:
                    for rec in await bus.sandboxes.read(sid):
                        if isinstance(rec.event, sb.SandboxCreated):
                            out[sid] = rec.event.warm
                return out
            finally:
                await bus.close()

        return asyncio.run(read())

    def warm_pids(self) -> list[int]:
        vms = self.data / "node" / "vms"
        return [
            int((d / "qemu.pid").read_text())
            for d in vms.glob("warm-*")
            if (d / "qemu.pid").exists()
        ]


def _timed_create(template: str) -> tuple[Any, float, float]:
    """(sandbox, create → envd answers, then its first command), seconds."""
    from e2b import Sandbox

    t0 = time.monotonic()
    sbx = Sandbox.create(template, timeout=300)
    t1 = time.monotonic()
    out = sbx.commands.run("echo hi").stdout.strip()
    t2 = time.monotonic()
    assert out == "hi", out
    return sbx, t1 - t0, t2 - t1


def part1(n: int, data: Path, rig: RigProcess) -> dict[str, Any]:
    from e2b import Sandbox

    st = BenchStack(data, "aenvwa", {"AENV_WARM_POOL_MAX": "1"})
    s: dict[str, list[float]] = {
        k: []
        for k in (
            "hit",
            "hit_first_command",
            "hit_total",
            "cold",
            "cold_first_command",
            "cold_total",
            "snap_hit",
            "snap_hit_first_command",
            "snap_cold",
            "snap_cold_first_command",
            "raw_restore",
            "raw_handover",
            "raw_handover_first_command",
        )
    }
    misclassified = 0
    try:
        src = Sandbox.create(timeout=600)
        src.files.write("/home/user/task.txt", "task")
        snap = src.create_snapshot().snapshot_id
        src.kill()
        Sandbox.create(snap, timeout=60).kill()  # demand: its pool starts
        for _ in range(n):
            for key, template in (("", "base"), ("snap_", snap)):
                st.wait_pool(template, 1)
                time.sleep(QUIET_S)
                a, a_create, a_cmd = _timed_create(template)  # handed the warm VM
                b, b_create, b_cmd = _timed_create(template)  # the pool is empty: restored
                kinds = st.created_warm([a.sandbox_id, b.sandbox_id])
                if kinds != {a.sandbox_id: True, b.sandbox_id: False}:
                    misclassified += 1
                for sbx, create, cmd in ((a, a_create, a_cmd), (b, b_create, b_cmd)):
                    kind = "hit" if kinds.get(sbx.sandbox_id) else "cold"
                    s[f"{key}{kind}"].append(create)
                    s[f"{key}{kind}_first_command"].append(cmd)
                    if not key:
                        s[f"{kind}_total"].append(create + cmd)
                a.kill()
                b.kill()
            time.sleep(QUIET_S)
            s["raw_restore"].append(rig.cycle()["same"])
            time.sleep(QUIET_S)
            w = rig.warm()
            s["raw_handover"].append(w["handover"])
            s["raw_handover_first_command"].append(w["first_command"])
        Sandbox.delete_snapshot(snap)
    finally:
        st.down()
    return {"samples": s, "misclassified_rounds": misclassified}


def _pss_kib(pid: int) -> int:
    m = read_smaps(pid)
    return m.pss // 1024 if m is not None else 0


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def part2(data: Path) -> dict[str, Any]:
    from e2b import Sandbox

    st = BenchStack(
        data, "aenvwb", {"AENV_WARM_POOL_MAX": str(BURST), "AENV_WARM_POOL_MIB": str(BURST * 512)}
    )
    try:
        with ThreadPoolExecutor(BURST) as ex:  # prime the demand: a burst of 16
            for sbx in ex.map(lambda _: Sandbox.create(timeout=300), range(BURST)):
                sbx.kill()
        st.wait_pool("base", BURST)
        time.sleep(3.0)  # the last warm-up's aftermath settles
        pids = st.warm_pids()
        pss = [_pss_kib(p) / 1024 for p in pids]
        before = {p: _cpu_ticks(p) for p in pids}
        time.sleep(IDLE_WINDOW_S)
        used = sum(_cpu_ticks(p) - before[p] for p in pids) / CLK_TCK
        idle_cpu_pct = 100 * used / IDLE_WINDOW_S
        time.sleep(QUIET_S)

        def one(_: int) -> tuple[str, float]:
            t0 = time.monotonic()
            sbx = Sandbox.create(timeout=300)
            return sbx.sandbox_id, time.monotonic() - t0

        t0 = time.monotonic()
        with ThreadPoolExecutor(BURST) as ex:
            made = list(ex.map(one, range(BURST)))
        wall = time.monotonic() - t0
        kinds = st.created_warm([sid for sid, _ in made])
        for sid, _ in made:
            Sandbox.kill(sid)
    finally:
        st.down()
    hits = [t for sid, t in made if kinds.get(sid)]
    return {
        "warm_vms": len(pids),
        "pss_mib_per_warm_vm": summary([p / 1000 for p in pss], unit="MiB"),
        "idle_cpu_pct_of_a_core_for_the_pool": round(idle_cpu_pct, 2),
        "idle_cpu_pct_of_a_core_per_8_warm_vms": round(idle_cpu_pct * 8 / max(1, len(pids)), 2),
        "burst": {
            "n": BURST,
            "hit_rate": round(len(hits) / BURST, 3),
            "wall_s": round(wall, 3),
            "create": summary([t for _, t in made]),
            "hits": summary(hits),
            "misses": summary([t for sid, t in made if not kinds.get(sid)]),
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--n", type=int, default=20)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="aenv-warmbench-", dir="/var/tmp"))
    rig: RigProcess | None = None
    try:
        rig = RigProcess(tmp / "raw")
        rig.cycle()
        one = part1(args.n, tmp / "stack1", rig)
        accel = rig.accel
        rig.close()
        rig = None
        two = part2(tmp / "stack2")
    finally:
        if rig is not None:
            rig.close()
        shutil.rmtree(tmp, ignore_errors=True)
    s = one["samples"]
    hit, cold, raw = summary(s["hit"]), summary(s["cold"]), summary(s["raw_restore"])
    handover = summary(s["raw_handover"])
    emit(
        "warm",
        {
            "accelerator": accel,
            "create_to_envd_ready_pool_hit": hit,
            "create_to_envd_ready_cold": cold,
            "raw_restore_to_envd_ready": raw,
            "raw_warm_handover_cont_and_init": handover,
            "ratio_hit_to_raw_handover_p50": ratio(hit, handover),
            "ratio_cold_to_raw_restore_p50": ratio(cold, raw),
            "ratio_hit_to_raw_restore_p50": ratio(hit, raw),
            "create_plus_first_command_pool_hit": summary(s["hit_total"]),
            "create_plus_first_command_cold": summary(s["cold_total"]),
            "first_command_after_hit": summary(s["hit_first_command"]),
            "first_command_after_cold": summary(s["cold_first_command"]),
            "raw_first_command_after_handover": summary(s["raw_handover_first_command"]),
            "snapshot_template": {
                "create_pool_hit": summary(s["snap_hit"]),
                "create_cold": summary(s["snap_cold"]),
                "first_command_after_hit": summary(s["snap_hit_first_command"]),
                "first_command_after_cold": summary(s["snap_cold_first_command"]),
            },
            "rounds_not_hit_then_miss": one["misclassified_rounds"],
            **two,
        },
    )


if __name__ == "__main__":
    main()
