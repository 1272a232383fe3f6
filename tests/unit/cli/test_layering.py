"""The sandbox commands are a client of the public API only: they import none of the
server's packages, and the e2b SDK only when a command runs (so `aenv up` and `--help`
start fast and work where the SDK is not installed)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CLIENT = [
    *(ROOT / "aenv" / "commands").glob("*.py"),
    *(ROOT / "aenv" / f for f in ("config.py", "output.py", "build_client.py", "dockerfile.py")),
]
SERVER = {"api", "bus", "envd", "projections", "shared", "workers", "bench", "domain", "aenv.stack"}


def _imports(path: Path, *, top_level_only: bool = False) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in tree.body if top_level_only else ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_client_modules_import_no_server_package() -> None:
    bad = {
        f"{f.relative_to(ROOT)}: {m}"
        for f in CLIENT
        for m in _imports(f)
        if any(m == s or m.startswith(s + ".") for s in SERVER)
    }
    assert not bad, sorted(bad)


def test_the_sdk_is_imported_lazily() -> None:
    eager = {
        f"{f.relative_to(ROOT)}: {m}"
        for f in CLIENT
        for m in _imports(f, top_level_only=True)
        if m.split(".")[0] == "e2b"
    }
    assert not eager, sorted(eager)
    probe = "import sys, aenv.cli; print('e2b' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


def test_operator_commands_load_server_packages_only_when_they_run() -> None:
    """`aenv.ops` (events, keys) may use `bus`/`projections`, but inside the commands: the
    help of every command, and every sandbox command, start without them."""
    ops = list((ROOT / "aenv" / "ops").glob("*.py"))
    eager = {
        f"{f.relative_to(ROOT)}: {m}"
        for f in ops
        for m in _imports(f, top_level_only=True)
        if any(m == s or m.startswith(s + ".") for s in SERVER)
    }
    assert not eager, sorted(eager)
    probe = "import sys, aenv.cli; print(sorted({'bus', 'nats', 'projections'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert out.stdout.strip() == "[]", out.stderr
