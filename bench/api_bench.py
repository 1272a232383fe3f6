"""Control-plane benchmark: E2B `Sandbox.create()` → envd ready, through a real `aenv up`
stack, next to the raw runtime restore (QEMU restore + envd /init, no API, no bus) measured
in the same run on the same host. The difference is what the control plane adds.

Raw and API samples are interleaved (raw restore, API create, raw, API, ...): on 2 shared
cores a minute of drift (page cache, a neighbour's burst) would otherwise land on one side
only. Besides the difference of the two medians, the bench pairs each API create and
resume with the restore the node logged for that very sandbox (`paired_overhead`): what
the control plane added to it, free of the restore's own variance.

Run as root: `python -m bench.api_bench [--n 20]`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aenv.stack.process import free_port
from bench.stats import emit, shift, summary

#: the node's log line for a restore: "sandbox <id> up|resumed: running <ms> ms, envd <ms> ms"
NODE_RESTORE = re.compile(r"sandbox (\w+) (up|resumed): running [\d.]+ ms, envd ([\d.]+) ms")
#: the node's log line for a persistent snapshot: how long the sandbox itself stood still
NODE_SNAPSHOT = re.compile(r"sandbox \w+ snapshot \S+: paused ([\d.]+) ms")
#: Between a pause and its resume in the "after wait" loop: an agent waiting on its model.
THINK_S = 0.5
#: Between the measured operations: each restore makes its RAM pool refill (a sparse copy
#: of the template's RAM, some 100 ms of I/O and CPU, at the lowest priority once the node
#: has been quiet for 0.3 s), the rig's and the node's alike; the next measurement, on
#: either side, should not share the host with it.
QUIET_S = 1.0


class RigProcess:
    """The raw side (bench/raw_rig.py) in its own process: see that module for why."""

    def __init__(self, state: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.raw_rig", str(state)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.accel = self._read()["accel"]

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the raw rig exited (code {self.proc.wait()}); see its stderr")
        out: dict[str, Any] = json.loads(line)
        return out

    def cycle(self) -> dict[str, float]:
        """One create-like restore, a pause and resume of it, and the bare primitive."""
        return self._ask("cycle")

    def warm(self) -> dict[str, float]:
        """The warm pool's hand-over (cont + /init) and the first command after it."""
        return self._ask("warm")

    def dirty(self, mib: int) -> dict[str, float]:
        """Raw stop + state, the runtime's pause and its resume after `mib` MiB written."""
        return self._ask(f"dirty {mib}")

    def memory(self, idle_s: float) -> dict[str, float]:
        """A create-like VM's and a bare copy-on-write restore's memory, idle `idle_s`."""
        return self._ask(f"memory {idle_s}")

    def _ask(self, request: str) -> dict[str, float]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{request}\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.write("close\n")
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def node_restores(log: Path) -> dict[tuple[str, str], list[float]]:
    """(sandbox id, "up"|"resumed") → the restore times the node logged for it, seconds,
    in order (a sandbox of the loop is resumed twice)."""
    out: dict[tuple[str, str], list[float]] = {}
    for line in log.read_text(errors="replace").splitlines():
        m = NODE_RESTORE.search(line)
        if m:
            out.setdefault((m.group(1), m.group(2)), []).append(float(m.group(3)) / 1000)
    return out


def snapshot_pauses(log: Path) -> list[float]:
    """How long each persistent snapshot kept its sandbox paused, seconds (node log)."""
    text = log.read_text(errors="replace")
    return [float(m.group(1)) / 1000 for m in NODE_SNAPSHOT.finditer(text)]


def run(n: int, data: Path, raw_state: Path) -> dict[str, Any]:
    port = free_port()
    # the cold path: no warm pool (bench/warm_bench.py measures it, beside this path)
    env = {
        **os.environ,
        "AENV_SLOT_PREFIX": "aenva",
        "AENV_NODE_ID": "bench",
        "AENV_WARM_POOL_MIB": "0",
        "AENV_TLS_PORT": str(free_port()),
    }
    up = subprocess.run(
        [sys.executable, "-m", "aenv.cli", "up", "--data-dir", str(data), "--port", str(port)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    if up.returncode != 0:
        raise SystemExit(f"aenv up failed: {up.stderr[-2000:]}")
    info = json.loads((data / "stack.json").read_text())
    os.environ.update({k: info[k] for k in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY")})
    import httpx
    from e2b import Sandbox

    s: dict[str, list[float]] = {
        k: []
        for k in (
            "create",
            "first_command",
            "kill",
            "pause",
            "resume",
            "resume_after_wait",
            "snapshot",
            "http_create",
            "raw_same",
            "raw_pause",
            "raw_resume",
            "raw_bare",
        )
    }
    created: list[tuple[str, float]] = []
    http_created: list[tuple[str, float]] = []
    resumed: list[tuple[str, float]] = []
    resumed_after_wait: list[tuple[str, float]] = []
    http = httpx.Client(
        base_url=info["E2B_API_URL"], headers={"X-API-KEY": info["E2B_API_KEY"]}, timeout=120
    )
    rig: RigProcess | None = None
    try:
        rig = RigProcess(raw_state)
        rig.cycle()  # warm-up of both sides: page cache, connections
        Sandbox.create().kill()
        for i in range(n):
            for k, v in rig.cycle().items():
                s[f"raw_{k}"].append(v)
            time.sleep(QUIET_S)
            # the control plane alone: one keep-alive HTTP client, no SDK objects to build
            t0 = time.monotonic()
            r = http.post("/sandboxes", json={"templateID": "base"})
            elapsed = time.monotonic() - t0
            r.raise_for_status()
            s["http_create"].append(elapsed)
            http_created.append((r.json()["sandboxID"], elapsed))
            http.delete(f"/sandboxes/{r.json()['sandboxID']}")
            time.sleep(QUIET_S)
            t0 = time.monotonic()
            sbx = Sandbox.create()
            s["create"].append(time.monotonic() - t0)
            created.append((sbx.sandbox_id, s["create"][-1]))
            t0 = time.monotonic()
            sbx.commands.run("true")
            s["first_command"].append(time.monotonic() - t0)
            t0 = time.monotonic()
            sbx.pause()
            s["pause"].append(time.monotonic() - t0)
            t0 = time.monotonic()
            sbx = Sandbox.connect(sbx.sandbox_id)  # resume: answers once envd is ready
            s["resume"].append(time.monotonic() - t0)
            resumed.append((sbx.sandbox_id, s["resume"][-1]))
            # The RL pattern: pause while the agent waits for its model, resume after. Back
            # to back (above) the resume shares the host with the pause's own aftermath
            # (projections, the released VM's teardown); here it does not.
            sbx.pause()
            time.sleep(THINK_S)
            t0 = time.monotonic()
            sbx = Sandbox.connect(sbx.sandbox_id)
            s["resume_after_wait"].append(time.monotonic() - t0)
            resumed_after_wait.append((sbx.sandbox_id, s["resume_after_wait"][-1]))
            if i < max(3, n // 4):  # persistent snapshots: fewer (each keeps a template)
                t0 = time.monotonic()
                sbx.create_snapshot(name=f"bench-{i}")
                s["snapshot"].append(time.monotonic() - t0)
                Sandbox.delete_snapshot(f"bench-{i}")
            t0 = time.monotonic()
            sbx.kill()
            s["kill"].append(time.monotonic() - t0)
            time.sleep(QUIET_S)
        restores = node_restores(data / "aenv.log")
        s["snapshot_paused"] = snapshot_pauses(data / "aenv.log")
    finally:
        http.close()
        if rig is not None:
            rig.close()
        subprocess.run(
            [sys.executable, "-m", "aenv.cli", "down", "--data-dir", str(data)],
            capture_output=True,
            timeout=120,
        )

    def paired(samples: list[tuple[str, float]], kind: str, nth: int = 0) -> list[float]:
        """Each API latency minus the node's own restore of that sandbox (its nth)."""
        out = []
        for sid, t in samples:
            times = restores.get((sid, kind), [])
            if len(times) > nth:
                out.append(t - times[nth])
        return out

    def own(samples: list[tuple[str, float]], kind: str, nth: int = 0) -> list[float]:
        """The node's own restore of each of these sandboxes (its nth)."""
        return [
            restores[(sid, kind)][nth]
            for sid, _ in samples
            if len(restores.get((sid, kind), [])) > nth
        ]

    return {
        **s,
        "node_restore_create": own(created, "up"),
        "node_restore_http_create": own(http_created, "up"),
        "paired_create": paired(created, "up"),
        "paired_http_create": paired(http_created, "up"),
        "paired_resume": paired(resumed, "resumed"),
        "paired_resume_after_wait": paired(resumed_after_wait, "resumed", nth=1),
        "accel": rig.accel if rig is not None else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--n", type=int, default=20)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="aenv-apibench-", dir="/var/tmp"))
    try:
        r = run(args.n, tmp / "stack", tmp / "raw")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    create, restore = summary(r["create"]), summary(r["raw_same"])
    http_create = summary(r["http_create"])
    resume, raw_resume = summary(r["resume"]), summary(r["raw_resume"])
    emit(
        "api",
        {
            "accelerator": r["accel"],
            "create_to_envd_ready": create,
            "raw_restore_to_envd_ready": restore,
            "control_plane_overhead_ms_p50": round(create["p50"] - restore["p50"], 3),
            "control_plane_overhead_ms_hodges_lehmann": shift(r["create"], r["raw_same"]),
            "create_via_http_to_envd_ready": http_create,
            "control_plane_overhead_http_ms_p50": round(http_create["p50"] - restore["p50"], 3),
            "control_plane_overhead_http_ms_hodges_lehmann": shift(r["http_create"], r["raw_same"]),
            "paired_overhead_create": summary(r["paired_create"]),
            "paired_overhead_create_http": summary(r["paired_http_create"]),
            # what the differences of medians above also carry: the restores of the two
            # groups of sandboxes differ by themselves (TCG restores fall into a few modes)
            "node_restore_in_sdk_creates": summary(r["node_restore_create"]),
            "node_restore_in_http_creates": summary(r["node_restore_http_create"]),
            "bare_cow_restore_to_envd_ready": summary(r["raw_bare"]),
            "first_command_through_proxy": summary(r["first_command"]),
            "kill": summary(r["kill"]),
            "pause_via_sdk": summary(r["pause"]),
            "raw_pause_capture_and_release": summary(r["raw_pause"]),
            "resume_via_sdk_to_envd_ready": resume,
            "raw_resume_to_envd_ready": raw_resume,
            "resume_overhead_ms_p50": round(resume["p50"] - raw_resume["p50"], 3),
            "resume_overhead_ms_hodges_lehmann": shift(r["resume"], r["raw_resume"]),
            "paired_overhead_resume": summary(r["paired_resume"]),
            "resume_after_wait_to_envd_ready": summary(r["resume_after_wait"]),
            "resume_after_wait_overhead_ms_p50": round(
                summary(r["resume_after_wait"])["p50"] - raw_resume["p50"], 3
            ),
            "resume_after_wait_overhead_ms_hodges_lehmann": shift(
                r["resume_after_wait"], r["raw_resume"]
            ),
            "paired_overhead_resume_after_wait": summary(r["paired_resume_after_wait"]),
            "persistent_snapshot_via_sdk": summary(r["snapshot"]),
            "persistent_snapshot_sandbox_paused": summary(r["snapshot_paused"]),
        },
    )


if __name__ == "__main__":
    main()
