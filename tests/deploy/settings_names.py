"""The `AENV_*` environment variables aenv reads, collected from the code itself.

Two sources, so that a setting added anywhere is known here without editing this file:
every pydantic-settings class in our packages (its `env_prefix` + field names, or the
field's alias), and the names the code reads straight from the environment
(`os.environ.get("AENV_X")`, `env.get("AENV_X")`, `X_ENV = "AENV_X"` constants).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pydantic import ValidationError
from pydantic_settings import BaseSettings

ROOT = Path(__file__).resolve().parents[2]
#: Our packages: where settings classes and environment reads are looked for.
PACKAGES = ("aenv", "api", "bus", "domain", "envd", "projections", "shared", "workers")

_SETTINGS_CLASS = re.compile(r"^class (\w+)\((?:\w+\.)?BaseSettings\)", re.M)
_ENV_READS = (
    # os.environ.get("AENV_X"), os.environ["AENV_X"], env.get("AENV_X"), os.getenv("AENV_X")
    re.compile(r"""\b(?:environ|env|getenv)\s*(?:\.get\s*)?[(\[]\s*["'](AENV_[A-Z0-9_]+)["']"""),
    # INSECURE_ENV = "AENV_INSECURE_REGISTRIES" (a module constant naming a variable)
    re.compile(r"""^\s*[A-Z_]*ENV\s*(?::\s*\w+\s*)?=\s*["'](AENV_[A-Z0-9_]+)["']""", re.M),
)


@dataclass(frozen=True)
class SettingsClass:
    """One pydantic-settings class and the environment variables it reads."""

    cls: type[BaseSettings]
    env_names: frozenset[str]

    @property
    def name(self) -> str:
        return f"{self.cls.__module__}.{self.cls.__qualname__}"


def _sources() -> Iterator[Path]:
    for pkg in PACKAGES:
        yield from sorted((ROOT / pkg).rglob("*.py"))


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _env_names(cls: type[BaseSettings]) -> frozenset[str]:
    prefix = str(cls.model_config.get("env_prefix", ""))
    names = set()
    for field_name, field in cls.model_fields.items():
        alias = field.validation_alias or field.alias
        name = alias if isinstance(alias, str) else prefix + field_name
        names.add(name.upper())  # pydantic-settings matches case-insensitively
    return frozenset(names)


@cache
def settings_classes() -> tuple[SettingsClass, ...]:
    """Every `BaseSettings` subclass defined in our packages, imported from its module."""
    found = []
    for path in _sources():
        for name in _SETTINGS_CLASS.findall(path.read_text()):
            cls = getattr(importlib.import_module(_module_name(path)), name)
            found.append(SettingsClass(cls, _env_names(cls)))
    assert found, "no settings class found: did the packages move?"
    return tuple(found)


@cache
def environ_reads() -> frozenset[str]:
    """`AENV_*` names the code reads from the environment without a settings class."""
    names: set[str] = set()
    for path in _sources():
        text = path.read_text()
        for pattern in _ENV_READS:
            names.update(pattern.findall(text))
    return frozenset(names)


@cache
def known_names() -> frozenset[str]:
    names = set(environ_reads())
    for s in settings_classes():
        names |= s.env_names
    return frozenset(names)


def is_literal(value: str) -> bool:
    """False for values a deployment tool fills in: `${X}` (compose), `$(X)` (Kubernetes)."""
    return "${" not in value and "$(" not in value


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    saved = {k: v for k, v in os.environ.items() if k.startswith("AENV_")}
    for k in saved:
        del os.environ[k]
    os.environ.update(env)
    try:
        yield
    finally:
        for k in env:
            os.environ.pop(k, None)
        os.environ.update(saved)


def parse_errors(env: Mapping[str, str]) -> list[str]:
    """What the settings classes reject in `env` (literal `AENV_*` values only), read the
    way the roles read them: from the process environment, by pydantic-settings."""
    literal = {k: v for k, v in env.items() if k.startswith("AENV_") and is_literal(v)}
    errors = []
    with _environment(literal):
        for s in settings_classes():
            if not s.env_names & literal.keys():
                continue
            try:
                s.cls()
            except ValidationError as e:
                for err in e.errors():
                    where = ".".join(str(p) for p in err["loc"])
                    errors.append(f"{s.name}.{where}: {err['msg']}")
    return errors
