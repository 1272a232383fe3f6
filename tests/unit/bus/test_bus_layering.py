"""Dependencies point inward (rule 4): the domain imports nothing of ours, `bus` only the
domain, `projections` only the domain and `bus`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
OURS = {"aenv", "api", "bus", "domain", "envd", "projections", "shared", "workers", "bench"}

ALLOWED = {
    "domain": {"domain"},
    "bus": {"domain", "bus"},
    "projections": {"domain", "bus", "projections"},
    # the builder drives sandboxes through the bus and envd (never the node's code)
    "workers/build": {"domain", "bus", "workers.build", "envd.version"},
}


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return {m for m in found if m.split(".")[0] in OURS}


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_point_inward(package: str) -> None:
    bad = {
        f"{f.relative_to(ROOT)}: {m}"
        for f in (ROOT / package).rglob("*.py")
        for m in _imports(f)
        if not any(m == a or m.startswith(a + ".") for a in ALLOWED[package])
    }
    assert not bad, sorted(bad)


def test_no_subject_literals_outside_subjects() -> None:
    offenders = [
        str(f.relative_to(ROOT))
        for pkg in ("bus", "projections")
        for f in (ROOT / pkg).rglob("*.py")
        if f.name != "subjects.py"
        and ('"aenv.evt' in f.read_text() or '"aenv.cmd' in f.read_text())
    ]
    assert offenders == []
