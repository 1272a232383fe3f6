"""`aenv config check`: an env file's lines, the registry's judgment of names and kinds,
the settings classes' of ranges and patterns, and the command's output and exit code."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from aenv.cli import app
from aenv.settings import REGISTRY
from aenv.settings.check import Assignment, check_assignments, kind_problem, parse
from aenv.settings.validate import class_findings

ROOT = Path(__file__).resolve().parents[3]
runner = CliRunner()


def test_parse_reads_systemd_and_compose_env_files() -> None:
    text = (
        "# comment\n; also a comment\n\nAENV_A=1\nexport AENV_B='two words'\n"
        'AENV_C="x=y"\n  AENV_D = spaced  \nAENV_E=\nnot an assignment\n'
    )
    found, problems = parse(text)
    assert [(a.line, a.name, a.value) for a in found] == [
        (4, "AENV_A", "1"),
        (5, "AENV_B", "two words"),
        (6, "AENV_C", "x=y"),
        (7, "AENV_D", "spaced"),
        (8, "AENV_E", ""),
    ]
    assert [(p.line, p.error) for p in problems] == [(9, True)]


@pytest.mark.parametrize(
    ("name", "value", "bad"),
    [
        ("AENV_REPLICAS", "3", False),
        ("AENV_REPLICAS", "three", True),
        ("AENV_REPLICAS", "", True),
        ("AENV_DRAIN_S", "30", False),
        ("AENV_DRAIN_S", "2.5", False),
        ("AENV_DRAIN_S", "30s", True),
        ("AENV_DRAIN_S", "nan", True),
        ("AENV_PROXY_VIA_NODE", "1", False),
        ("AENV_PROXY_VIA_NODE", "True", False),
        ("AENV_PROXY_VIA_NODE", "maybe", True),
        ("AENV_NATS_URL", "nats://a:4222,nats://u:p@b:4222", False),
        ("AENV_NATS_URL", "nats://a:4222,b", True),
        ("AENV_DATABASE_URL", "postgresql+asyncpg://u:p@db:5432/aenv", False),
        ("AENV_DATABASE_URL", "db:5432", True),
        ("AENV_S3_ENDPOINT", "http://s3:port", True),
        ("AENV_S3_ENDPOINT", "", False),
        ("AENV_DEFAULT_ON_TIMEOUT", "kill", False),
        ("AENV_DEFAULT_ON_TIMEOUT", "stop", True),
        ("AENV_SLOT_CIDR", "anything", False),
    ],
)
def test_values_are_judged_by_their_kind(name: str, value: str, bad: bool) -> None:
    assert (kind_problem(REGISTRY[name], value) is not None) == bad


def test_unknown_names_are_errors_with_a_suggestion_other_names_are_not_judged() -> None:
    found = check_assignments(
        [
            Assignment(1, "AENV_REPLICA", "3"),
            Assignment(2, "E2B_DOMAIN", "x"),
            Assignment(3, "AENV_PROXY_PORT", "$(PORT)"),  # filled in by Kubernetes
            Assignment(4, "AENV_PROXY_PORT", "7000"),
        ]
    )
    assert [(f.line, f.error, f.message) for f in found] == [
        (1, True, "AENV_REPLICA is not a setting aenv knows (did you mean AENV_REPLICAS?)"),
        (4, False, "AENV_PROXY_PORT set again (line 3); this one wins"),
    ]


def test_ranges_and_patterns_are_the_settings_classes() -> None:
    found = class_findings(
        [
            Assignment(1, "AENV_REPLICAS", "9"),
            Assignment(2, "AENV_NODE_ID", "Node_B"),
            Assignment(3, "AENV_NODE_HOST", "firecracker"),
            Assignment(4, "AENV_CAPACITY", "8"),
            Assignment(5, "AENV_DISK_BUDGET_SHARE", "1.5"),
        ],
        skip=frozenset({"AENV_NODE_HOST"}),
    )
    assert [(f.line, f.name) for f in found] == [
        (1, "AENV_REPLICAS"),
        (2, "AENV_NODE_ID"),
        (5, "AENV_DISK_BUDGET_SHARE"),
    ]
    assert "less than or equal to 5" in found[0].message


def test_the_command_passes_the_shipped_example_and_fails_a_broken_copy(tmp_path: Path) -> None:
    example = ROOT / "deploy" / "systemd" / "aenv.env.example"
    r = runner.invoke(app, ["config", "check", str(example)])
    assert r.exit_code == 0, r.output
    assert r.output.strip().endswith("0 errors, 0 warnings")
    broken = tmp_path / "aenv.env"
    broken.write_text(example.read_text() + "AENV_REPLICA=3\nAENV_SLOT_POOL=many\n")
    r = runner.invoke(app, ["config", "check", str(broken)])
    assert r.exit_code == 1
    lines = r.output.splitlines()
    assert any(
        ln.startswith(f"{broken}:")
        and ln.endswith(
            "error: AENV_REPLICA is not a setting aenv knows (did you mean AENV_REPLICAS?)"
        )
        for ln in lines
    ), r.output
    assert any("error: AENV_SLOT_POOL: 'many' is not an integer" in ln for ln in lines), r.output
    assert lines[-1].endswith("2 errors, 0 warnings")
    r = runner.invoke(app, ["config", "check", str(tmp_path / "absent.env")])
    assert r.exit_code == 2
