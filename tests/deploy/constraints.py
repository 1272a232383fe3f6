"""constraints.txt: the exact versions of every package aenv installs, read from a working venv.

pyproject.toml says what aenv accepts (`nats-py>=2.9`); constraints.txt says what was tested:
the image (deploy/compose/Dockerfile), deploy/install.sh and CI (scripts/setup.sh) all
install with `pip install -c constraints.txt`, so a release runs the versions CI ran, not
whatever PyPI holds on the day of the install. Made from the venv the suite passes in:

    .venv/bin/python -m tests.deploy.constraints > constraints.txt    # make constraints

Two sections: what the roles need at run time (the image and install.sh install only
these), then what the `embedded`, `test` and `dev` extras add (CI installs all of them).
"""

from __future__ import annotations

import re
import sys
import tomllib
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

__all__ = ["EXTRAS", "closure", "parse", "render", "requirements"]

ROOT = Path(__file__).resolve().parents[2]
#: The extras CI installs (scripts/setup.sh: `pip install -e '.[test,dev,embedded]'`)
EXTRAS = ("embedded", "test", "dev")
#: The project's own names (the old and the new distribution name): never a constraint
_SELF = {"aenv", "aenv-platform"}
_RUNTIME_HEAD = "# --- runtime: what the roles import (the image, deploy/install.sh)"
_EXTRAS_HEAD = "# --- extras: embedded servers, tests and gates (CI: scripts/setup.sh)"


def _norm(name: str) -> str:
    """PEP 503's normal form: `Typing_Extensions` and `typing-extensions` are one name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(extras: Iterable[str] = ()) -> list[Requirement]:
    """pyproject.toml's dependencies, plus those of `extras`."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in extras:
        lines += project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


def closure(roots: Iterable[Requirement]) -> dict[str, str]:
    """{normal name: installed version} of `roots` and everything they pull in, as this
    interpreter's environment has them (markers evaluated here, extras followed)."""
    found: dict[str, str] = {}
    todo = [(r, frozenset(r.extras)) for r in roots]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        req, extras = todo.pop()
        key = (_norm(req.name), extras)
        if key in seen or key[0] in _SELF:
            continue
        seen.add(key)
        dist = metadata.distribution(req.name)  # PackageNotFoundError: the venv lacks it
        found[key[0]] = dist.version
        for line in dist.requires or []:
            sub = Requirement(line)
            wanted = sub.marker is None or any(
                sub.marker.evaluate({"extra": e}) for e in (extras or {""})
            )
            if wanted:
                todo.append((sub, frozenset(sub.extras)))
    return found


def render(runtime: dict[str, str], everything: dict[str, str]) -> str:
    """The file: a header, the runtime pins, then the pins only the extras need."""
    head = [
        "# Exact versions of what aenv installs, from the venv the suite passed in.",
        "# Used as `pip install -c constraints.txt` by deploy/install.sh, the image",
        "# (deploy/compose/Dockerfile) and CI (scripts/setup.sh). Made by `make constraints`",
        "# (tests/deploy/constraints.py); tests/deploy/test_constraints.py checks it.",
    ]
    rest = {k: v for k, v in everything.items() if k not in runtime}
    body = [_RUNTIME_HEAD, *(f"{k}=={runtime[k]}" for k in sorted(runtime))]
    body += [_EXTRAS_HEAD, *(f"{k}=={rest[k]}" for k in sorted(rest))]
    return "\n".join([*head, *body]) + "\n"


def parse(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """(runtime pins, extras-only pins) of a constraints file `render` wrote."""
    sections: list[dict[str, str]] = [{}, {}]
    current = -1
    for line in text.splitlines():
        if line in (_RUNTIME_HEAD, _EXTRAS_HEAD):
            current = 0 if line == _RUNTIME_HEAD else 1
        elif line and not line.startswith("#"):
            name, _, version = line.partition("==")
            sections[current][_norm(name)] = version
    return sections[0], sections[1]


def main() -> None:
    runtime = closure(requirements())
    everything = closure(requirements(EXTRAS))
    sys.stdout.write(render(runtime, everything))


if __name__ == "__main__":
    main()
