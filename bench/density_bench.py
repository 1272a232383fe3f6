"""Density and capture benchmark (issue 33), through the unchanged E2B SDK against an
`aenv up` stack of its own, beside the raw primitives measured in the same run by the raw
rig (bench/raw_rig.py: the node's runtime on the same template, no API, no bus).

(a) Memory of idle sandboxes: `--n` sandboxes created from the `base` template (not
    forks: the common case, one fresh sandbox per episode), idle `--idle` s; each one's
    QEMU PSS (`/proc/<pid>/smaps_rollup`) ÷ its guest RAM, and sandboxes per GiB of host
    memory used (their summed PSS) against nominal (their guest RAM); beside them the
    node's own series (`aenv_node_guest_memory_bytes`), the host's MemAvailable drop, the
    same for `--n` fork children of one sandbox, and the raw rig's create-like restore and
    bare copy-on-write restore (the primitive fork children use) idle as long.
(b) Captures under writes: per round a fresh sandbox whose guest writes `--write-mib` MiB
    of random bytes to a file without a sync, then `pause`, the resume that follows
    (`Sandbox.connect`), the same write again and `create_snapshot`; the same rounds on
    an idle guest. Beside them the raw rig's QEMU stop + device state written (what
    runtime_bench calls snapshot_stop_to_state_written), the runtime's pause, its resume,
    and its live capture after the second write (a `create_snapshot`'s VM work), on a
    guest that wrote as much and on an idle one.
(c) Balloon reclaim: null, with the reason (no balloon device yet).

The warm pool is off (`AENV_WARM_POOL_MIB=0`): its VMs would sit in the memory figures,
and every create is then the template restore the figures are about.
Run as root, under the VM lock: `flock /tmp/aenv-vm.lock python -m bench.density_bench`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from aenv.stack.process import free_port
from bench.api_bench import QUIET_S, RigProcess
from bench.raw_rig import WRITE_TIMEOUT_S, write_command
from bench.stackup import AENV, aenv_up
from bench.stats import emit, ratio, summary
from workers.node.usage import Smaps, read_smaps

MIB = 1 << 20
GIB = 1 << 30
NODE = "density"
SDK_ENV = ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY")
BALLOON_NULL = (
    "no balloon device: QEMU is started without virtio-balloon (issue 33 adds one with free "
    "page reporting), so memory a guest frees stays on the host; nothing to measure yet"
)


# ---- pure helpers ----------------------------------------------------------------------
def per_gib(count: int, used_bytes: float) -> float | None:
    """How many such sandboxes one GiB of host memory holds, at `used_bytes` for `count`."""
    return round(count * GIB / used_bytes, 2) if used_bytes > 0 and count else None


def memory_figures(vms: list[Smaps], guest_bytes: int) -> dict[str, Any]:
    """PSS per VM ÷ guest RAM, and sandboxes per GiB used (ΣPSS) against nominal."""
    if not vms:
        return {"n": 0}
    total = sum(vms, Smaps())
    nominal = len(vms) * guest_bytes
    return {
        "n": len(vms),
        "pss_mib_per_vm": summary([m.pss / MIB for m in vms], "MiB", 1.0),
        "pss_over_guest_ram": summary([m.pss / guest_bytes for m in vms], "ratio", 1.0),
        "rss_mib_per_vm": summary([m.rss / MIB for m in vms], "MiB", 1.0),
        "shared_mib_sum": round(total.shared / MIB, 1),
        "private_mib_sum": round(total.private / MIB, 1),
        "pss_mib_sum": round(total.pss / MIB, 1),
        "nominal_mib_sum": round(nominal / MIB, 1),
        "per_gib_used_pss": per_gib(len(vms), total.pss),
        "per_gib_nominal": per_gib(len(vms), nominal),
        "nominal_over_used_pss": round(nominal / total.pss, 2) if total.pss else None,
    }


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


# ---- the stack -------------------------------------------------------------------------
class Stack:
    """`aenv up` on a data dir of its own until `down`; the node's QEMU pids and series."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.env = {
            **{k: v for k, v in os.environ.items() if k not in SDK_ENV},
            "AENV_SLOT_PREFIX": "aenvdn",
            "AENV_NODE_ID": NODE,
            "AENV_TLS_PORT": str(free_port()),
            "AENV_WARM_POOL_MIB": "0",
        }
        exports = aenv_up(data, self.env, timeout=900)
        os.environ.update({k: exports[k] for k in SDK_ENV})
        self.info = json.loads((data / "stack.json").read_text())

    def down(self) -> None:
        subprocess.run(
            [*AENV, "down", "--data-dir", str(self.data)],
            capture_output=True,
            timeout=180,
            env=self.env,
        )

    def qemu_pid(self, sandbox_id: str) -> int:
        return int((self.data / "node" / "vms" / sandbox_id / "qemu.pid").read_text())

    def node_memory(self) -> dict[str, float]:
        """The node's `aenv_node_guest_*` series now, MiB."""
        from aenv.ops.fleet import read_beats

        (beat,) = asyncio.run(read_beats(str(self.info["nats_url"])))
        r = httpx.get(
            f"http://{beat.proxy}/metrics",
            headers={"Authorization": f"Bearer {self.info['metrics_token']}"},
            timeout=10,
        )
        r.raise_for_status()
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(r.text):
            for s in family.samples:
                if s.name == "aenv_node_guest_memory_bytes":
                    out[f"{s.labels['kind']}_mib"] = round(s.value / MIB, 1)
                elif s.name == "aenv_node_guest_ram_bytes":
                    out["guest_ram_mib"] = round(s.value / MIB, 1)
        return out


# ---- (a) memory ------------------------------------------------------------------------
def idle_memory(
    st: Stack, sandbox_ids: list[str], idle_s: float
) -> tuple[list[Smaps], dict[str, float]]:
    """The sandboxes' QEMUs' `Smaps` after `idle_s`, and the node's series then."""
    time.sleep(idle_s)
    vms = [m for sid in sandbox_ids if (m := read_smaps(st.qemu_pid(sid))) is not None]
    return vms, st.node_memory()


def density(st: Stack, args: argparse.Namespace) -> dict[str, Any]:
    """(a): the guest RAM of each sandbox is the node's nominal figure ÷ its VMs (the
    `base` template's size, as the node gave it)."""
    from e2b import Sandbox

    out: dict[str, Any] = {}
    time.sleep(QUIET_S)
    before = mem_available()
    made = [Sandbox.create(timeout=900) for _ in range(args.n)]
    try:
        vms, node = idle_memory(st, [s.sandbox_id for s in made], args.idle)
        drop = before - mem_available()
        guest_bytes = int(node["guest_ram_mib"] * MIB) // max(1, args.n)
        out["template_sandboxes"] = {
            **memory_figures(vms, guest_bytes),
            "node_series_mib": node,
            "host_memavailable_drop_mib": round(drop / MIB, 1),
            "per_gib_used_memavailable": per_gib(len(vms), drop),
        }
    finally:
        for s in made:
            s.kill()
    if args.fork_children:
        time.sleep(QUIET_S)
        parent = Sandbox.create(timeout=900)
        kids: list[Any] = []
        try:
            before = mem_available()
            kids = [k for k in parent.fork(count=args.fork_children) if isinstance(k, Sandbox)]
            vms, node = idle_memory(st, [k.sandbox_id for k in kids], args.idle)
            drop = before - mem_available()
            out["fork_children"] = {
                **memory_figures(vms, guest_bytes),
                "node_series_mib_with_parent": node,
                "host_memavailable_drop_mib": round(drop / MIB, 1),
            }
        finally:
            for k in kids:
                k.kill()
            parent.kill()
    return out


# ---- (b) captures under writes ---------------------------------------------------------
def capture_rounds(rounds: int, write_mib: int) -> dict[str, list[float]]:
    """`rounds` fresh sandboxes: write (if any), pause, resume, write again, snapshot."""
    from e2b import Sandbox

    s: dict[str, list[float]] = {"pause": [], "resume": [], "create_snapshot": []}
    for _ in range(rounds):
        sbx = Sandbox.create(timeout=900)
        snap = None
        try:
            if write_mib:
                sbx.commands.run(write_command(write_mib), timeout=WRITE_TIMEOUT_S)
            time.sleep(QUIET_S)
            t0 = time.monotonic()
            assert sbx.pause()
            s["pause"].append(time.monotonic() - t0)
            t0 = time.monotonic()
            sbx = Sandbox.connect(sbx.sandbox_id, timeout=900)
            s["resume"].append(time.monotonic() - t0)
            if write_mib:
                sbx.commands.run(write_command(write_mib), timeout=WRITE_TIMEOUT_S)
            time.sleep(QUIET_S)
            t0 = time.monotonic()
            snap = sbx.create_snapshot().snapshot_id
            s["create_snapshot"].append(time.monotonic() - t0)
        finally:
            sbx.kill()
            if snap is not None:
                Sandbox.delete_snapshot(snap)
    return s


def raw_rounds(rig: RigProcess, rounds: int, write_mib: int) -> dict[str, list[float]]:
    s: dict[str, list[float]] = {}
    for _ in range(rounds):
        time.sleep(QUIET_S)
        for k, v in rig.dirty(write_mib).items():
            s.setdefault(k, []).append(v)
    return s


def captures(st: Stack, rig: RigProcess, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"write_mib": args.write_mib}
    for name, mib in (("idle", 0), ("written", args.write_mib)):
        sdk, raw = capture_rounds(args.rounds, mib), raw_rounds(rig, args.rounds, mib)
        part: dict[str, Any] = {f"sdk_{k}": summary(v) for k, v in sdk.items()}
        part |= {f"raw_{k}": summary(v) for k, v in raw.items()}
        part["ratio_sdk_pause_to_raw_stop_and_state"] = ratio(
            part["sdk_pause"], part["raw_stop_and_state"]
        )
        part["ratio_sdk_resume_to_raw_resume_envd"] = ratio(
            part["sdk_resume"], part["raw_resume_envd"]
        )
        part["ratio_sdk_snapshot_to_raw_stop_and_state"] = ratio(
            part["sdk_create_snapshot"], part["raw_stop_and_state"]
        )
        part["ratio_sdk_snapshot_to_raw_live_capture"] = ratio(
            part["sdk_create_snapshot"], part["raw_live_capture"]
        )
        out[name] = part
    out["ratio_written_to_idle_sdk_pause"] = ratio(
        out["written"]["sdk_pause"], out["idle"]["sdk_pause"]
    )
    out["ratio_written_to_idle_sdk_resume"] = ratio(
        out["written"]["sdk_resume"], out["idle"]["sdk_resume"]
    )
    out["ratio_written_to_idle_sdk_create_snapshot"] = ratio(
        out["written"]["sdk_create_snapshot"], out["idle"]["sdk_create_snapshot"]
    )
    return out


def raw_memory(rig: RigProcess, rounds: int, idle_s: float) -> dict[str, Any]:
    got: dict[str, list[float]] = {}
    for _ in range(rounds):
        for k, v in rig.memory(idle_s).items():
            got.setdefault(k, []).append(v)
    guest = got["guest_mem_bytes"][0]
    out: dict[str, Any] = {"guest_mem_mib": guest / MIB}
    for vm in ("create_like", "bare_cow"):
        out[vm] = {
            "pss_mib": summary([x / MIB for x in got[f"{vm}_pss"]], "MiB", 1.0),
            "pss_over_guest_ram": summary([x / guest for x in got[f"{vm}_pss"]], "ratio", 1.0),
            "shared_mib": summary([x / MIB for x in got[f"{vm}_shared"]], "MiB", 1.0),
            "private_mib": summary([x / MIB for x in got[f"{vm}_private"]], "MiB", 1.0),
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--n", type=int, default=6, help="idle template sandboxes")
    p.add_argument("--fork-children", type=int, default=6, help="0 skips the fork figures")
    p.add_argument("--idle", type=float, default=5.0, help="seconds idle before reading PSS")
    p.add_argument("--rounds", type=int, default=5, help="capture rounds per mode")
    p.add_argument("--write-mib", type=int, default=256, help="written before each capture")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="aenv-densitybench-", dir="/var/tmp"))
    rig: RigProcess | None = None
    st: Stack | None = None
    try:
        rig = RigProcess(tmp / "raw")
        raw_mem = raw_memory(rig, 3, args.idle)
        st = Stack(tmp / "stack")
        dense = density(st, args)
        caps = captures(st, rig, args)
        accel = rig.accel
    finally:
        if st is not None:
            st.down()
        if rig is not None:
            rig.close()
        shutil.rmtree(tmp, ignore_errors=True)
    tpl = dense["template_sandboxes"]
    emit(
        "density",
        {
            "accelerator": accel,
            "idle_s": args.idle,
            "memory": dense,
            "memory_raw": raw_mem,
            "ratio_template_sandbox_pss_to_raw_create_like_p50": ratio(
                tpl["pss_mib_per_vm"], raw_mem["create_like"]["pss_mib"]
            ),
            "ratio_template_sandbox_pss_to_raw_bare_cow_p50": ratio(
                tpl["pss_mib_per_vm"], raw_mem["bare_cow"]["pss_mib"]
            ),
            "captures": caps,
            "balloon_reclaim": None,
            "balloon_reclaim_reason": BALLOON_NULL,
        },
    )


if __name__ == "__main__":
    main()
