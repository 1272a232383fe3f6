"""The import contracts (pyproject `[tool.importlinter]`) hold, and they bite: a copy of the
tree with one forbidden import added fails `lint-imports` naming that import."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.lint.acyclic import circles
from tests.lint.private_names import private_uses

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = [
    "aenv",
    "aenv_pipeline",
    "api",
    "bench",
    "bus",
    "domain",
    "envd",
    "projections",
    "shared",
    "workers",
]
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT), "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def _copy(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    ignore = shutil.ignore_patterns("__pycache__")
    for pkg in [*PACKAGES, "tests/lint"]:
        shutil.copytree(ROOT / pkg, tree / pkg, ignore=ignore)
    (tree / "tests" / "__init__.py").touch()
    shutil.copy(ROOT / "pyproject.toml", tree)
    return tree


def test_the_contracts_hold() -> None:
    out = _lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr


#: (module, the forbidden import added to it, what the lint must name)
FORBIDDEN = [
    ("workers/node/journal.py", "import api.errors", "workers.node.journal -> api.errors"),
    ("workers/timer/timer.py", "import workers.node.journal", "workers.timer"),
    ("domain/errors.py", "import bus.errors", "domain.errors -> bus.errors"),
    ("envd/log.py", "import domain", "envd.log -> domain"),
    ("api/errors.py", "import envd.procs", "api.errors -> envd.procs"),
    # the pipeline client installs without the server: none of its packages
    ("aenv_pipeline/names.py", "import bus.subjects", "aenv_pipeline.names -> bus.subjects"),
    ("bus/subjects.py", "import aenv_pipeline.names", "bus.subjects -> aenv_pipeline.names"),
]


def test_every_forbidden_import_and_a_circle_fail_the_lint_and_are_named(tmp_path: Path) -> None:
    """One copy of the tree with every bad import added and two modules that import each
    other (the second under TYPE_CHECKING, which still counts), one run of the lint (each
    run takes seconds): each is reported, so one cannot hide behind another."""
    tree = _copy(tmp_path)
    for module, line, _ in FORBIDDEN:
        with (tree / module).open("a") as f:
            f.write(f"\n{line}  # noqa\n")
    (tree / "domain" / "circle_a.py").write_text("import domain.circle_b  # noqa\n")
    (tree / "domain" / "circle_b.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    import domain.circle_a\n"
    )
    out = _lint(tree)
    assert out.returncode != 0, out.stdout
    for _, _, names in FORBIDDEN:
        assert names in out.stdout, (names, out.stdout)
    assert "domain.circle_a, domain.circle_b" in out.stdout, out.stdout


def test_private_names_of_another_package_are_reported() -> None:
    source = (
        "from domain.sandbox import values as v\n"
        "from domain.sandbox.values import _b32_id\n"
        "import bus._hidden\n"
        "from api import _mine\n"  # api's own private names are its business
        "x = v._b32_id(b'')\n"
        "y = v.__all__\n"
    )
    uses = private_uses("api.sandboxes", source, {"api", "bus", "domain"})
    assert [u.line for u in uses] == [2, 3, 5], uses


def test_circles_are_the_groups_that_reach_each_other() -> None:
    imports = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e2"}, "e2": {"e"}}
    assert circles(imports, imports) == [["a", "b", "c"], ["e", "e2"]]
    assert circles(["x", "y"], {"x": {"y"}}) == []
