"""The settings registry is complete and true to the code (issue 30): every `AENV_*` name
the code reads is in it, nothing it lists is read by nobody, and each class-backed
setting has its class's type and default — so docs/settings.md, generated from it, and
`aenv config check` cannot drift from what the roles do."""

from __future__ import annotations

import logging
import re
import typing
from pathlib import Path

import pytest
from pydantic import SecretStr
from pydantic.fields import FieldInfo

from aenv.settings import REGISTRY, Kind, Setting, closest, report_unknown
from aenv.settings.validate import SETTINGS_CLASSES, env_names
from tests.deploy.settings_names import PACKAGES, ROOT, environ_reads, settings_classes

#: `AENV_*` tokens in the code that are no setting: the streams' names, a shell marker
#: prefix (`__AENV_DONE_<id>__`) and `AENV_S3_*` written as a family in prose.
NOT_SETTINGS = frozenset(
    {"AENV_EVT", "AENV_CMD", "AENV_DONE_", "AENV_S3_", "AENV_FEED", "AENV_TEAM_"}
)
_TOKEN = re.compile(r"AENV_[A-Z0-9_]+")


def _class_names() -> set[str]:
    return {name for cls in SETTINGS_CLASSES for name in env_names(cls)}


def test_every_aenv_name_in_the_code_is_a_setting_or_known_not_to_be_one() -> None:
    """What `grep -rhoE "AENV_[A-Z0-9_]+"` finds in our packages, docstrings included (a
    docstring naming a setting that does not exist misleads as much as a bad env file)."""
    tokens: dict[str, Path] = {}
    for pkg in (*PACKAGES, "codeint", "migrations"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for token in _TOKEN.findall(path.read_text()):
                tokens.setdefault(token, path.relative_to(ROOT))
    missing = {t: str(p) for t, p in tokens.items() if t not in REGISTRY and t not in NOT_SETTINGS}
    assert not missing, f"read by the code, missing from aenv/settings/: {missing}"


def test_every_name_read_by_a_settings_class_or_the_environment_is_registered() -> None:
    read = _class_names() | environ_reads()
    assert sorted(read - REGISTRY.keys()) == []
    assert sorted(REGISTRY.keys() - read) == [], "registered, read by nothing"


def test_the_validated_classes_are_every_settings_class_of_the_code() -> None:
    assert {s.cls for s in settings_classes()} == set(SETTINGS_CLASSES)


def _format(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _kinds(field: FieldInfo) -> set[Kind]:
    """The registry kinds a field's type allows."""
    args = [a for a in typing.get_args(field.annotation) if a is not type(None)]
    base = args[0] if typing.get_origin(field.annotation) is not typing.Literal and args else None
    tp = base if base is not None else field.annotation
    if typing.get_origin(tp) is typing.Literal:
        return {Kind.CHOICE}
    return {
        bool: {Kind.BOOL},
        int: {Kind.INT},
        float: {Kind.FLOAT},
        Path: {Kind.PATH},
        SecretStr: {Kind.SECRET},
        str: {Kind.STR, Kind.URL, Kind.URLS, Kind.SECRET, Kind.CHOICE},
    }[typing.cast(type, tp)]


def test_kinds_and_defaults_are_the_classes() -> None:
    wrong = []
    defaults: dict[str, set[str]] = {}
    for cls in SETTINGS_CLASSES:
        for env, name in env_names(cls).items():
            field = cls.model_fields[name]
            setting = REGISTRY[env]
            if setting.kind not in _kinds(field):
                wrong.append(f"{env}: {setting.kind} but {cls.__name__}.{name}: {field.annotation}")
            if field.default_factory is None:
                defaults.setdefault(env, set()).add(_format(field.default))
    for env, values in defaults.items():
        setting = REGISTRY[env]
        if not setting.computed and setting.default not in values:
            wrong.append(f"{env}: default {setting.default!r}, the classes say {sorted(values)}")
    assert wrong == []


def test_choices_are_the_classes() -> None:
    for cls in SETTINGS_CLASSES:
        for env, name in env_names(cls).items():
            field = cls.model_fields[name]
            if typing.get_origin(field.annotation) is typing.Literal:
                assert REGISTRY[env].choices == typing.get_args(field.annotation), env


@pytest.mark.parametrize("setting", list(REGISTRY.values()), ids=list(REGISTRY))
def test_every_setting_says_what_it_is(setting: Setting) -> None:
    assert setting.meaning.endswith((".", ")")) and len(setting.meaning) > 15
    assert setting.roles and set(setting.roles) <= {"api", "node", "up", "cli"}
    assert (setting.kind is Kind.CHOICE) == bool(setting.choices)
    if setting.kind is Kind.CHOICE and setting.default:
        assert setting.default in setting.choices


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("AENV_REPLICA", "AENV_REPLICAS"),
        ("AENV_NATS_URLS", "AENV_NATS_URL"),
        ("aenv_replicas", "AENV_REPLICAS"),
        ("AENV_NODEID", "AENV_NODE_ID"),
        ("AENV_WARM_POOL_MB", "AENV_WARM_POOL_MIB"),
        ("AENV_TOTALLY_NEW", None),
    ],
)
def test_the_closest_known_name_is_suggested(typed: str, meant: str | None) -> None:
    assert closest(typed, REGISTRY) == meant


def test_a_role_start_warns_of_each_unknown_name(caplog: pytest.LogCaptureFixture) -> None:
    env = {"AENV_REPLICA": "3", "AENV_REPLICAS": "3", "AENV_ZZZ": "1", "PATH": "/bin"}
    with caplog.at_level(logging.WARNING, logger="aenv"):
        assert report_unknown(env) == ["AENV_REPLICA", "AENV_ZZZ"]
    assert [r.getMessage() for r in caplog.records] == [
        "AENV_REPLICA is not a setting aenv knows (did you mean AENV_REPLICAS?)",
        "AENV_ZZZ is not a setting aenv knows (docs/settings.md lists every one)",
    ]
