"""A small reading of PromQL for the deploy checks: which aggregation takes each
occurrence of a series, so that a fleet-wide gauge (`tests.series.FLEET_WIDE`: one value
every API or node exports alike) is never summed once per instance."""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["AGGREGATIONS", "enclosing_aggregations", "fleet_sum_errors"]

AGGREGATIONS = frozenset(
    {"sum", "max", "min", "avg", "count", "group", "stddev", "stdvar", "topk", "bottomk"}
)
#: What may take a fleet-wide gauge: each reads one copy of the value
_ONE_COPY = frozenset({"max", "min", "avg"})
_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|\{[^}]*\}|\[[^\]]*\]|[A-Za-z_:][A-Za-z0-9_:]*|\S')


def enclosing_aggregations(expr: str) -> list[tuple[str, str | None]]:
    """(series name, innermost aggregation around it or None) for every word of `expr`
    that is not a function, an aggregation or a label of a `by`/`without` list."""
    out: list[tuple[str, str | None]] = []
    stack: list[str] = []  # what each open parenthesis belongs to
    prev = ""  # the previous token
    before_by = ""  # the aggregation a `by`/`without` list belongs to
    closed = ""  # what the last closed parenthesis belonged to
    for m in _TOKEN.finditer(expr):
        tok = m.group()
        if tok == "(":
            if prev in ("by", "without"):
                stack.append(f"labels:{before_by}")
            elif prev == ")" and closed.startswith("labels:"):
                stack.append(closed.removeprefix("labels:"))
            elif re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", prev):
                stack.append(prev)
            else:
                stack.append("")
        elif tok == ")":
            closed = stack.pop() if stack else ""
        elif re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", tok):
            if tok in ("by", "without"):
                before_by = prev
            elif not (stack and stack[-1].startswith("labels:")):
                following = expr[m.end() :].lstrip()[:1]
                if following != "(" and tok not in AGGREGATIONS:
                    agg = next((f for f in reversed(stack) if f in AGGREGATIONS), None)
                    out.append((tok, agg))
        prev = tok
    return out


def fleet_sum_errors(exprs: Iterable[str], fleet_wide: Iterable[str]) -> list[str]:
    """Each query that sums (or counts, or shows raw) a fleet-wide gauge."""
    wide = set(fleet_wide)
    errors = []
    for expr in exprs:
        for name, agg in enclosing_aggregations(expr):
            if name in wide and agg not in _ONE_COPY:
                how = f"{agg}(" if agg else "no max/min/avg"
                errors.append(f"{expr!r}: {name} is fleet-wide, taken by {how}")
    return errors
