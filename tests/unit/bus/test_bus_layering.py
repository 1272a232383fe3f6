"""Names in one place (rule 1): no module but `bus/subjects.py` writes a subject literal.
(Which package may import which is checked by import-linter: pyproject.toml.)"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("aenv", "api", "bench", "bus", "domain", "envd", "projections", "shared", "workers")


def test_no_subject_literals_outside_subjects() -> None:
    offenders = [
        str(f.relative_to(ROOT))
        for pkg in PACKAGES
        for f in (ROOT / pkg).rglob("*.py")
        if f.name != "subjects.py"
        and ('"aenv.evt' in f.read_text() or '"aenv.cmd' in f.read_text())
    ]
    assert offenders == []
