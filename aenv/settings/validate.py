"""`aenv config check`'s second pass: the values of an env file read by the very settings
classes the roles read them with, so that a range or a pattern (`AENV_REPLICAS` 1-5, a
node id's characters) is judged as the role would judge it at start. Imports every role's
settings (the API's pull in Litestar): only the command that checks a file loads this."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import ValidationError
from pydantic_settings import BaseSettings

from aenv.roles.common import RoleSettings
from aenv.serve import StackSettings
from aenv.settings.check import Assignment, Finding, is_literal
from aenv.tls.settings import TlsSettings
from api.context import ApiSettings
from bus.settings import BusSettings
from projections.db import DbSettings
from workers.node.settings import NodeSettings
from workers.timer.settings import TimerSettings

__all__ = ["SETTINGS_CLASSES", "class_findings", "env_names"]

#: Every pydantic-settings class of aenv (a unit test holds this list to the code).
SETTINGS_CLASSES: tuple[type[BaseSettings], ...] = (
    BusSettings,
    DbSettings,
    RoleSettings,
    StackSettings,
    TlsSettings,
    ApiSettings,
    NodeSettings,
    TimerSettings,
)


def env_names(cls: type[BaseSettings]) -> dict[str, str]:
    """The environment variable of each field of `cls`: {variable name: field name}."""
    prefix = str(cls.model_config.get("env_prefix", ""))
    return {(prefix + name).upper(): name for name in cls.model_fields}


def class_findings(assignments: list[Assignment], skip: frozenset[str]) -> list[Finding]:
    """What the settings classes reject among the literal values of `assignments`, except
    for names in `skip` (already reported). Each value is validated alone, with the other
    fields at their defaults — never the checking process's own environment."""
    last: Mapping[str, Assignment] = {a.name: a for a in assignments}  # the last one wins
    findings: dict[str, Finding] = {}
    for cls in SETTINGS_CLASSES:
        for env, field in env_names(cls).items():
            a = last.get(env)
            if a is None or env in skip or env in findings or not is_literal(a.value):
                continue
            try:
                cls.model_validate({field: a.value})
            except ValidationError as e:
                reasons = "; ".join(err["msg"] for err in e.errors())
                findings[env] = Finding(a.line, env, f"{env}: {a.value!r}: {reasons}")
    return sorted(findings.values(), key=lambda f: f.line)
