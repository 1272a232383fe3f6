"""The module size gate: no module of the service packages grows past the bar.

A module past ~450 lines has almost always taken a second job (the node worker at 655 held
its handlers, its volume moves and its create bookkeeping); splitting it later costs more
than keeping it small as it grows. The bar applies to the packages that hold the services
and their core (`GATED`); the CLI, envd, benchmarks and tests are outside it. Run by
`make lint` and `scripts/test.sh`: `python -m tests.lint.module_size` exits 1 naming each
module over the bar.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

__all__ = ["GATED", "MAX_LINES", "oversized"]

#: The packages the bar applies to (issue 27)
GATED = ("api", "bus", "workers", "projections", "domain", "aenv_pipeline")
MAX_LINES = 450


def _modules(root: Path) -> Iterator[Path]:
    for package in GATED:
        yield from sorted((root / package).rglob("*.py"))


def oversized(root: Path, limit: int = MAX_LINES) -> list[tuple[Path, int]]:
    """Each gated module longer than `limit` lines, with its length."""
    out = []
    for path in _modules(root):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > limit:
            out.append((path.relative_to(root), lines))
    return out


def main() -> int:
    root = Path(__file__).resolve().parents[2]
    over = oversized(root)
    for path, lines in over:
        print(f"{path}: {lines} lines, over the bar of {MAX_LINES}: split it by job")
    count = sum(1 for _ in _modules(root))
    print(f"module size: {count} modules in {', '.join(GATED)}; {len(over)} over {MAX_LINES}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
