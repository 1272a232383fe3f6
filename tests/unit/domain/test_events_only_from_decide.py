"""No event is built outside a `decide` (issue: one command path): services send commands
and let the domain say what happened. The one exception is the consumer wrapper's record of
a refused command (`CommandRejected`), which decides nothing on any state."""

from __future__ import annotations

import ast
from pathlib import Path

from domain import EVENT_TYPES

ROOT = Path(__file__).resolve().parents[3]
SERVICES = ("aenv", "api", "bus", "projections", "shared", "workers")
ALLOWED = {("bus/consumer.py", "CommandRejected")}


def _constructed(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
            if name in EVENT_TYPES:
                names.add(name)
    return names


def test_events_are_built_only_by_the_domain() -> None:
    found = {
        (str(f.relative_to(ROOT)), name)
        for pkg in SERVICES
        for f in (ROOT / pkg).rglob("*.py")
        for name in _constructed(f)
    }
    assert found - ALLOWED == set()
