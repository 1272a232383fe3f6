"""`GET /metrics`: a point-in-time resource snapshot of the guest, in envd's JSON shape."""

from __future__ import annotations

import os
import time
from typing import Any

_last_cpu: tuple[int, int] | None = None  # (busy, total) jiffies at the previous call


def _cpu_pct() -> float:
    global _last_cpu
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])
    busy = total - idle
    prev = _last_cpu or (0, 0)
    _last_cpu = (busy, total)
    d_total = total - prev[1]
    return round(100.0 * (busy - prev[0]) / d_total, 2) if d_total > 0 else 0.0


def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts:
                    out[key] = int(parts[0]) * 1024
    except (OSError, ValueError):
        pass
    return out


def snapshot() -> dict[str, Any]:
    mem = _meminfo()
    total = mem.get("MemTotal", 0)
    used = total - mem.get("MemAvailable", mem.get("MemFree", 0))
    try:
        vfs = os.statvfs("/")
        disk_total = vfs.f_blocks * vfs.f_frsize
        disk_used = (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize
    except OSError:
        disk_total = disk_used = 0
    return {
        "ts": int(time.time()),
        "cpu_count": os.cpu_count() or 1,
        "cpu_used_pct": _cpu_pct(),
        "mem_total_mib": total // (1024 * 1024),
        "mem_used_mib": used // (1024 * 1024),
        "mem_total": total,
        "mem_used": used,
        "mem_cache": mem.get("Cached", 0),
        "disk_used": disk_used,
        "disk_total": disk_total,
    }
