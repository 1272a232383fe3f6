"""aenv's own version (`aenv --version`): the installed distribution's, else the source tree's.

The distribution is `aenv-platform` (`aenv` on PyPI is an unrelated project); the version
lives in pyproject.toml alone. A checkout run without installing it (PYTHONPATH, or a venv
holding an older install under another name) reads it from the pyproject.toml beside the
packages instead.
"""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

__all__ = ["DISTRIBUTION", "version"]

DISTRIBUTION = "aenv-platform"
_PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def version() -> str:
    """`0.1.0`; `unknown` when neither the metadata nor a pyproject.toml says."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pass
    try:
        project = tomllib.loads(_PYPROJECT.read_text())["project"]
    except (OSError, tomllib.TOMLDecodeError, KeyError):
        return "unknown"
    return str(project.get("version", "unknown"))
