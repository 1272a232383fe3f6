"""Summary statistics and JSON output shared by every benchmark script."""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def summary(samples: list[float], unit: str = "ms", scale: float = 1000.0) -> dict[str, Any]:
    """min/p50/p99/max/mean of `samples` (seconds), scaled to `unit`."""
    if not samples:
        return {"n": 0}
    xs = sorted(s * scale for s in samples)

    def pct(p: float) -> float:
        k = max(0, min(len(xs) - 1, math.ceil(p / 100 * len(xs)) - 1))
        return round(xs[k], 3)

    return {
        "n": len(xs),
        "unit": unit,
        "min": round(xs[0], 3),
        "p50": pct(50),
        "p99": pct(99),
        "max": round(xs[-1], 3),
        "mean": round(statistics.fmean(xs), 3),
    }


def shift(a: list[float], b: list[float], scale: float = 1000.0) -> float | None:
    """How much larger `a` is than `b` (seconds in, `scale`d out): the median of all the
    pairwise differences (Hodges-Lehmann). Under TCG a restore takes one of a few times
    ~30-100 ms apart, at random; the difference of two medians of 30 then jumps by that
    much depending on which mode each median falls in, while this estimate stays put."""
    if not a or not b:
        return None
    return round(statistics.median(x - y for x in a for y in b) * scale, 3)


def ratio(a: dict[str, Any], b: dict[str, Any], key: str = "p50") -> float | None:
    if not a.get(key) or not b.get(key):
        return None
    return round(float(a[key]) / float(b[key]), 3)


def emit(name: str, doc: dict[str, Any]) -> None:
    """Print the result JSON and keep a copy in bench/results/<name>.json."""
    doc = {
        "bench": name,
        "at": datetime.now(UTC).isoformat(),
        "host": {"kernel": platform.release(), "cpus": _cpus()},
        **doc,
    }
    RESULTS.mkdir(exist_ok=True)
    text = json.dumps(doc, indent=2)
    (RESULTS / f"{name}.json").write_text(text + "\n")
    print(text)


def _cpus() -> int:
    return os.cpu_count() or 0
