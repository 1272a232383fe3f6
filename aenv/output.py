"""How the CLI prints results: a rich table for a person at a terminal, JSON for a pipe.

Scripts get a stable shape (`aenv ls | jq`) without asking for it; `-o` forces either.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any

__all__ = ["Format", "emit", "wants_json"]


class Format(StrEnum):
    """`-o/--output` choices; `auto` picks `table` on a TTY and `json` otherwise."""

    auto = "auto"
    table = "table"
    json = "json"


def wants_json(fmt: Format) -> bool:
    if fmt is Format.auto:
        return not sys.stdout.isatty()
    return fmt is Format.json


def emit(
    rows: Sequence[dict[str, Any]],
    columns: Sequence[str],
    fmt: Format,
    human: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> None:
    """Print `rows` as a JSON array (every field, machine values) or as a table of
    `columns`, each row first passed through `human` (relative times, short forms)."""
    if wants_json(fmt):
        sys.stdout.write(json.dumps(list(rows), indent=2, default=str) + "\n")
        return
    if human is not None:
        rows = [human(r) for r in rows]
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, header_style="bold", pad_edge=False)
    for c in columns:
        table.add_column(c.upper().replace("_", " "), no_wrap=c == columns[0], overflow="fold")
    for r in rows:
        table.add_row(*(_cell(r.get(c)) for c in columns))
    Console().print(table)


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, dict):
        return ",".join(f"{k}={x}" for k, x in v.items())
    return str(v)
