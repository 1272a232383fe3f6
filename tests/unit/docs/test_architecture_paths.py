"""docs/ARCHITECTURE.md names only code that exists: every path and module it quotes.

The document is a newcomer's map; a map naming files that were split or renamed sends them
looking for what is not there (issue 27 found 6 of 12 claims stale). Every backquoted token
that looks like a path (`workers/node/worker.py`, `api/console/`, `bus/subjects.py::X`) must
exist from the repository's root (and the functions and classes named after `::` in that
file), every dotted module of ours (`workers.node.forks`) must be
a module, and a bare module file name (`early.py`) must name some file of the tree.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
#: deploy.md too: an operator follows its paths to files under deploy/ (issue 31's TLS files)
DOCS = [ROOT / "docs" / "ARCHITECTURE.md", ROOT / "docs" / "deploy.md"]
PACKAGES: tuple[str, ...] = (
    "aenv",
    "api",
    "bench",
    "bus",
    "codeint",
    "domain",
    "envd",
    "projections",
    "shared",
)
PACKAGES += ("workers", "migrations", "tests", "scripts", "deploy", "docs")
#: What the code writes, not what the repository holds (gitignored output, runtime files)
GENERATED = ("bench/results/",)
RUNTIME_SUFFIXES = (".log", ".json")
#: NATS subjects and bucket names look like dotted modules: they are names on the bus
SUBJECTS = ("aenv.cmd.", "aenv.evt.", "aenv_")
_TICKED = re.compile(r"`([^`\n]+)`")
_PATH = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*/?$")
_FILE = re.compile(r"^[a-z0-9_]+\.py$")
_MODULE = re.compile(r"^[a-z_]+(\.[a-z_0-9]+)+$")


def _skipped(name: str) -> bool:
    return name in {".git", "node_modules"} or name.startswith(".venv")


def _tree_names() -> set[str]:
    """Every file and directory name of the tree, the venvs, git and npm's modules pruned
    before they are walked (they hold most of the machine's files, none of ours)."""
    names: set[str] = set()
    for _, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not _skipped(d)]
        names.update(dirs, files)
    return names


def _missing(text: str, names: set[str]) -> list[str]:
    missing = []
    for ticked in _TICKED.findall(text):
        token, _, defined = ticked.strip().partition("::")
        head = token.split("/")[0]
        if token.startswith((*GENERATED, *SUBJECTS)) or token.endswith(RUNTIME_SUFFIXES):
            continue
        if "/" in token and head in PACKAGES and _PATH.match(token):
            if not (ROOT / token).exists():
                missing.append(token)
            elif defined and token.endswith(".py"):
                missing += _undefined(ROOT / token, defined, ticked)
        elif _MODULE.match(token) and head.split(".")[0] in PACKAGES:
            base = ROOT / token.replace(".", "/")
            if not (base.with_suffix(".py").exists() or (base / "__init__.py").exists()):
                # `module.function`: the part before the last dot must be a module file
                parent = ROOT / token.rsplit(".", 1)[0].replace(".", "/")
                if not parent.with_suffix(".py").exists():
                    missing.append(token)
        elif _FILE.match(token) and token not in names:
            missing.append(token)
    return missing


def _undefined(path: Path, names: str, ticked: str) -> list[str]:
    """`file.py::Class.method`: each dotted part is defined in the file (`def`/`class`)."""
    source = path.read_text(encoding="utf-8")
    for name in names.split("."):
        if not re.search(rf"^\s*(async def|def|class) {re.escape(name)}\b", source, re.M):
            return [ticked]
    return []


def test_every_path_the_architecture_names_exists() -> None:
    names = _tree_names()
    for doc in DOCS:
        missing = _missing(doc.read_text(encoding="utf-8"), names)
        assert not missing, f"{doc.name} names what does not exist: {sorted(set(missing))}"


def test_the_check_bites() -> None:
    names = {"worker.py"}
    text = (
        "`workers/node/nothing.py` `workers.node.nowhere` `gone.py` `workers/node/worker.py` "
        "`workers/node/worker.py::NodeWorker.handle` `workers/node/worker.py::NodeWorker.gone`"
    )
    assert _missing(text, names) == [
        "workers/node/nothing.py",
        "workers.node.nowhere",
        "gone.py",
        "workers/node/worker.py::NodeWorker.gone",
    ]
