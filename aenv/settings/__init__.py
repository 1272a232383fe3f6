"""Every `AENV_*` environment variable aenv reads, in one registry (issue 30).

The tables (`connections`, `service`, `node`) say each setting's kind, default, readers
and meaning; `docs/settings.md` is generated from them (`aenv config reference`),
`aenv config check FILE` validates an env file against them, and every role names the
`AENV_*` variables of its environment that are none of them (`report_unknown`). A unit
test holds the registry to the code: every name a settings class or an environment read
uses is here, with the class's kind and default, and nothing else.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from aenv.settings.connections import CONNECTIONS
from aenv.settings.model import Kind, Setting, closest, unknown
from aenv.settings.node import NODE
from aenv.settings.service import SERVICE

__all__ = [
    "REGISTRY",
    "SECTIONS",
    "Kind",
    "Setting",
    "closest",
    "report_unknown",
    "unknown",
    "unknown_message",
]

#: The reference's sections, in order: a title and its settings.
SECTIONS: tuple[tuple[str, tuple[Setting, ...]], ...] = (
    ("Connections, the event log, logging, the supervisor and the CLI", CONNECTIONS),
    ("The API role", SERVICE),
    ("The node role", NODE),
)
#: Every setting by name.
REGISTRY: Mapping[str, Setting] = {s.name: s for _, table in SECTIONS for s in table}

log = logging.getLogger("aenv")


def unknown_message(name: str) -> str:
    """What to tell about an `AENV_*` name aenv does not read."""
    near = closest(name, REGISTRY)
    hint = f"did you mean {near}?" if near else "docs/settings.md lists every one"
    return f"{name} is not a setting aenv knows ({hint})"


def report_unknown(env: Mapping[str, str]) -> list[str]:
    """Log a warning for each `AENV_*` name in `env` that aenv does not read (a misspelt
    setting is otherwise ignored without a word); the names, for the caller."""
    names = unknown(env, REGISTRY)
    for name in names:
        log.warning("%s", unknown_message(name))
    return names
