"""`aenv config check`'s pure part: an env file's assignments, and what is wrong with them
by the registry alone (unknown names, values of the wrong kind). The settings classes'
own constraints (ranges, patterns) are `aenv.settings.validate`'s."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from aenv.settings import REGISTRY, Kind, Setting, unknown_message

__all__ = ["Assignment", "Finding", "check_assignments", "is_literal", "kind_problem", "parse"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INT = re.compile(r"[+-]?[0-9]+")
#: What pydantic takes for a bool (case-insensitive), as the roles read them.
_BOOLS = frozenset({"0", "1", "true", "false", "yes", "no", "on", "off", "t", "f", "y", "n"})


@dataclass(frozen=True)
class Assignment:
    """One `NAME=value` of an env file, at its line (1-based)."""

    line: int
    name: str
    value: str


@dataclass(frozen=True)
class Finding:
    """One problem of an env file: an error fails the check, a warning does not."""

    line: int
    name: str
    message: str
    error: bool = True

    def render(self, path: str) -> str:
        level = "error" if self.error else "warning"
        where = f"{path}:{self.line}" if self.line else path
        return f"{where}: {level}: {self.message}"


def parse(text: str) -> tuple[list[Assignment], list[Finding]]:
    """The assignments of a systemd EnvironmentFile or a compose `.env` file: `NAME=value`
    lines, optionally `export NAME=value`, the value optionally in single or double quotes;
    blank lines and lines starting with `#` or `;` are skipped. A line that is none of
    these is an error (systemd would ignore it, and the setting with it)."""
    found: list[Assignment] = []
    problems: list[Finding] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        line = line.removeprefix("export ").lstrip()
        name, sep, value = line.partition("=")
        name = name.strip()
        if not sep or not _NAME.fullmatch(name):
            problems.append(Finding(number, name, f"not a NAME=value line: {raw.strip()!r}"))
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        found.append(Assignment(number, name, value))
    return found, problems


def is_literal(value: str) -> bool:
    """False for a value a deployment tool fills in (`${X}`, `$(X)`): not checked here."""
    return "${" not in value and "$(" not in value


def _url_problem(value: str) -> str | None:
    parts = urlsplit(value)
    if not parts.scheme or not parts.netloc:
        return f"{value!r} is not a URL (want scheme://host[:port]...)"
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number or out of range
    except ValueError as e:
        return f"{value!r} is not a URL ({e})"
    return None


def kind_problem(setting: Setting, value: str) -> str | None:
    """Why `value` cannot be `setting`'s value by its kind alone; None when it can."""
    kind = setting.kind
    if kind is Kind.INT and not _INT.fullmatch(value):
        return f"{value!r} is not an integer"
    if kind is Kind.FLOAT:
        try:
            number = float(value)
        except ValueError:
            return f"{value!r} is not a number (seconds, a share: 30, 0.5)"
        if not math.isfinite(number):
            return f"{value!r} is not a finite number"
    if kind is Kind.BOOL and value.strip().lower() not in _BOOLS:
        return f"{value!r} is not a boolean (1/0, true/false, yes/no, on/off)"
    if kind is Kind.URL and value:
        return _url_problem(value)
    if kind is Kind.URLS:
        urls = [u.strip() for u in value.split(",")]
        if not any(urls):
            return "no URL given"
        for url in urls:
            if problem := _url_problem(url):
                return problem
    if kind is Kind.CHOICE and value not in setting.choices:
        return f"{value!r} is not one of {', '.join(setting.choices)}"
    return None


def check_assignments(assignments: list[Assignment]) -> list[Finding]:
    """Unknown `AENV_*` names (with the closest known one), values of the wrong kind, and
    names set twice (the last wins, as in systemd: a warning). Other names (`E2B_*`,
    `OTEL_*`, `PATH`) are not aenv's to judge."""
    findings: list[Finding] = []
    first: dict[str, int] = {}
    for a in assignments:
        if a.name in first:
            findings.append(
                Finding(
                    a.line,
                    a.name,
                    f"{a.name} set again (line {first[a.name]}); this one wins",
                    False,
                )
            )
        first.setdefault(a.name, a.line)
        if not a.name.startswith("AENV_"):
            continue
        setting = REGISTRY.get(a.name)
        if setting is None:
            findings.append(Finding(a.line, a.name, unknown_message(a.name)))
        elif is_literal(a.value) and (problem := kind_problem(setting, a.value)):
            findings.append(Finding(a.line, a.name, f"{a.name}: {problem}"))
    return findings
