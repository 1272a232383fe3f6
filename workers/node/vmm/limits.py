"""Host-side caps on a QEMU process: memory and CPU time, via cgroup v2 or v1.

The guest's own RAM size bounds what the guest can use; these caps bound what a QEMU
process can cost the node (TCG translation buffers, device emulation, a runaway guest
keeping vCPUs busy). Hosts without a writable cgroup hierarchy run without caps, and say
so once in the log.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path

from workers.node.vmm import cgroups

log = logging.getLogger(__name__)

PERIOD_US = 100_000

#: where VM cgroups go, found on the first VM of the process (`cgroups.discover`)
_placement: cgroups.Placement | None = None
#: VMs started since the node began that run without caps
_uncapped: set[int] = set()


def placement() -> cgroups.Placement:
    """Where this process puts VM cgroups (found once, and said once in the log)."""
    global _placement
    if _placement is None:
        _placement = cgroups.discover()
        level = logging.INFO if _placement.inside else logging.WARNING
        log.log(level, "VM cgroups: %s", _placement.reason)
    return _placement


def warnings(pids: list[int]) -> list[str]:
    """What an operator must know about the caps of the VMs `pids` (the node's readiness
    answer says it): nothing before the node's first VM looked for its cgroups."""
    where = _placement
    out = []
    if where is not None and not where.inside:
        out.append(f"VM cgroups are not in the node's own cgroup: {where.reason}")
    if n := uncapped(pids):
        out.append(f"{n} VM(s) run without memory and CPU caps")
    return out


def uncapped(pids: list[int]) -> int:
    """How many of these VM processes (the node's, all of them) run without caps; the
    others' pids are forgotten."""
    _uncapped.intersection_update(pids)
    return len(_uncapped)


@dataclass(frozen=True)
class Limits:
    mem_bytes: int
    cpus: float  # CPU time as a number of cores


@dataclass(frozen=True)
class Applied:
    """Where a process was placed; `remove()` deletes these directories."""

    dirs: tuple[Path, ...]


def apply(pid: int, name: str, limits: Limits) -> Applied | None:
    """Put `pid` into a fresh cgroup named `name` with `limits`; None if unsupported."""
    where = placement()
    try:
        if where.version == 2:
            return _apply_v2(pid, where.parents[0] / name, limits)
        if where.version == 1:
            return _apply_v1(pid, where.parents[0] / name, where.parents[1] / name, limits)
        raise OSError(where.reason)
    except OSError as e:
        log.warning("cgroup limits unavailable (%s); QEMU %d runs uncapped", e, pid)
        _uncapped.add(pid)
        return None


def remove(applied: Applied | None) -> None:
    """Delete the cgroup directories (their processes must have exited). Idempotent."""
    if applied is None:
        return
    for d in applied.dirs:
        with contextlib.suppress(OSError):
            d.rmdir()
        if len(applied.dirs) == 2:  # v1: `aenv/` goes with its last VM (EBUSY while not),
            # so the cgroup of a service or command that ends is not left with a child
            with contextlib.suppress(OSError):
                d.parent.rmdir()


def _apply_v2(pid: int, d: Path, limits: Limits) -> Applied:
    d.mkdir(exist_ok=True)
    (d / "memory.max").write_text(str(limits.mem_bytes))
    (d / "cpu.max").write_text(f"{int(limits.cpus * PERIOD_US)} {PERIOD_US}")
    (d / "cgroup.procs").write_text(str(pid))
    return Applied((d,))


def _apply_v1(pid: int, mem: Path, cpu: Path, limits: Limits) -> Applied:
    for d in (mem, cpu):
        for attempt in range(3):  # (its `aenv/` removed by the last VM's `remove` meanwhile)
            try:
                d.mkdir(parents=True, exist_ok=True)
                break
            except FileNotFoundError:
                if attempt == 2:
                    raise
    (mem / "memory.limit_in_bytes").write_text(str(limits.mem_bytes))
    (cpu / "cpu.cfs_period_us").write_text(str(PERIOD_US))
    (cpu / "cpu.cfs_quota_us").write_text(str(int(limits.cpus * PERIOD_US)))
    (mem / "cgroup.procs").write_text(str(pid))
    (cpu / "cgroup.procs").write_text(str(pid))
    return Applied((mem, cpu))


def oom_kills(applied: Applied | None) -> int:
    """How many processes the kernel's OOM killer ended in this cgroup (0 when unknown):
    why a VM died. v2 counts them in `memory.events`, v1 (kernel ≥ 4.13) in
    `memory.oom_control`."""
    if applied is None:
        return 0
    for d in applied.dirs:
        for name in ("memory.events", "memory.oom_control"):
            try:
                text = (d / name).read_text()
            except OSError:
                continue
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and value.strip().isdigit():
                    return int(value)
    return 0


def read_limits(applied: Applied) -> Limits:
    """What the kernel holds for this cgroup (tests verify caps through this)."""
    if len(applied.dirs) == 1:
        d = applied.dirs[0]
        quota, period = (d / "cpu.max").read_text().split()
        return Limits(int((d / "memory.max").read_text()), int(quota) / int(period))
    mem, cpu = applied.dirs
    q = int((cpu / "cpu.cfs_quota_us").read_text())
    p = int((cpu / "cpu.cfs_period_us").read_text())
    return Limits(int((mem / "memory.limit_in_bytes").read_text()), q / p)


#: CPU weights (cgroup v2 `cpu.weight`, 1..10000, default 100): a VM nobody waits for yet
#: (a warm pool's, restoring and warming up) yields the CPU to every VM a client waits on.
WEIGHT_BACKGROUND = 1
WEIGHT_DEFAULT = 100


def set_weight(applied: Applied | None, weight: int) -> None:
    """Set the cgroup's CPU weight (v1: `cpu.shares`, scaled); a no-op without a cgroup."""
    if applied is None:
        return
    try:
        if len(applied.dirs) == 1:
            (applied.dirs[0] / "cpu.weight").write_text(str(weight))
        else:
            (applied.dirs[1] / "cpu.shares").write_text(str(max(2, weight * 1024 // 100)))
    except OSError as e:  # a weight is a preference: never fail the VM for it
        log.warning("cannot set the CPU weight of %s: %s", applied.dirs[-1], e)
