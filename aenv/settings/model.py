"""What one `AENV_*` setting is: its name, the kind of value it takes, its default, which
processes read it and what it is for. The tables (`aenv.settings.fleet`, `.node`) list
every one; a unit test holds them to the code (every name a settings class or an
environment read uses is there, with the class's default and type)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["Kind", "Setting", "closest", "unknown"]


class Kind(StrEnum):
    """The kind of value a setting takes, as `aenv config check` validates it."""

    STR = "string"
    INT = "integer"
    FLOAT = "number"
    BOOL = "boolean"
    URL = "URL"
    URLS = "URLs"  # comma-separated
    PATH = "path"
    SECRET = "secret"
    CHOICE = "choice"


@dataclass(frozen=True)
class Setting:
    """One `AENV_*` environment variable aenv reads."""

    name: str
    kind: Kind
    #: As an env file would spell it; "" when unset means something of its own (the
    #: meaning says what).
    default: str
    #: Which processes read it: `api`, `node` (`aenv serve --role …`), `up` (the whole
    #: stack's supervisor: `aenv up`, `aenv serve --role all`), `cli` (the `aenv` commands).
    roles: tuple[str, ...]
    meaning: str
    #: The values a `CHOICE` takes.
    choices: tuple[str, ...] = ()
    #: The default is computed at start (the host name, a minted secret): `default` then
    #: describes it, and the check against the settings classes' defaults skips it.
    computed: bool = False


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name `name` was most likely meant to be (a typo, a missing letter, a
    dropped word), or None when nothing is close enough to suggest."""
    upper = name.upper()
    found = difflib.get_close_matches(upper, list(known), n=1, cutoff=0.75)
    return found[0] if found else None


def unknown(env: Mapping[str, str] | Iterable[str], known: Mapping[str, Setting]) -> list[str]:
    """The `AENV_*` names in `env` aenv does not read, sorted."""
    return sorted(n for n in env if n.startswith("AENV_") and n not in known)
