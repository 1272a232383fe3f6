"""Every sandbox command documents itself: `--help` names its arguments and the options a
user needs, and bad usage exits 2 before anything talks to a server."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from aenv.cli import app

runner = CliRunner()

EXPECTED = {
    "auth": ["--api-url", "--api-key", "credentials"],
    "start": ["template", "--detach", "--timeout", "--rm", "--metadata"],
    "cn": ["sandbox_id", "paused"],
    "exec": ["sandbox_id", "command", "--cwd", "--env", "--interactive", "exit code", "124"],
    "upload": ["sandbox_id", "local", "remote"],
    "download": ["sandbox_id", "remote", "local"],
    "ls": ["--output", "json", "--state", "--metadata"],
    "pause": ["sandbox_id"],
    "resume": ["sandbox_id", "--timeout"],
    "timeout": ["sandbox_id", "seconds"],
    "rm": ["sandbox_ids", "--all", "--metadata", "--state", "how many"],
    "info": ["sandbox_id", "--output", "node", "metadata"],
    "fork": ["sandbox_id", "--count", "one per line"],
    "build": [
        "dockerfile",
        "--name",
        "--context",
        "--build-arg",
        "--cpu",
        "--memory",
        "--disk",
        "--start-cmd",
        "--ready-cmd",
        "COPY",
    ],
    "pull": ["image", "--name", "OCI", "registry"],
    "template ls": ["--output", "json"],
    "template rm": ["names"],
}


@pytest.mark.parametrize("command", sorted(EXPECTED))
def test_help_names_arguments_and_options(command: str) -> None:
    r = runner.invoke(app, [*command.split(), "--help"], terminal_width=200)
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    for word in EXPECTED[command]:
        assert word in text, f"`aenv {command} --help` does not mention {word!r}:\n{r.output}"
    if command != "auth":
        assert "--api-url" in text and "--data-dir" in text


def test_top_level_help_lists_every_command() -> None:
    r = runner.invoke(app, ["--help"], terminal_width=200)
    assert r.exit_code == 0
    for command in EXPECTED:
        assert f" {command.split()[0]} " in r.output


@pytest.mark.parametrize(
    "argv",
    [
        ["exec"],
        ["fork", "x", "-n", "0"],
        ["timeout", "x", "0"],
        ["ls", "-o", "yaml"],
        ["start", "-m", "novalue"],
        ["build", "Dockerfile"],
        ["build", "-n", "Bad Name"],
        ["build", "/nonexistent/Dockerfile", "-n", "x"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], tmp_path: object) -> None:
    env = {"AENV_API_URL": "http://127.0.0.1:9", "AENV_API_KEY": "e2b_x"}
    assert runner.invoke(app, argv, env=env).exit_code == 2


def test_top_level_help_explains_configuration_and_exit_codes() -> None:
    text = " ".join(runner.invoke(app, ["--help"], terminal_width=200).output.split())
    for word in ("AENV_API_URL", "aenv auth", "Exit codes", "--debug"):
        assert word in text


NESTED = {
    ("snapshot", "create"): ["sandbox_id", "--name", "aenv start SNAPSHOT_ID", "--api-url"],
    ("snapshot", "ls"): ["--output", "json", "--sandbox", "--api-url"],
    ("snapshot", "rm"): ["snapshots", "team/name", "--api-url"],
    ("events",): [
        "sandbox_id",
        "--follow",
        "Ctrl-C",
        "--output",
        "one object per line",
        "lineage",
        "--data-dir",
    ],
    ("keys", "create"): ["--name", "--team", "--data-dir"],
    ("keys", "ls"): ["--output", "--team", "revoked_at", "prefix", "--data-dir"],
    ("keys", "revoke"): ["key_id", "401", "--data-dir"],
    ("keys", "limits"): ["key_id", "--max-sandboxes", "--creates-per-s", "--burst", "--clear"],
}


@pytest.mark.parametrize("argv", sorted(NESTED), ids=" ".join)
def test_new_commands_document_themselves(argv: tuple[str, ...]) -> None:
    r = runner.invoke(app, [*argv, "--help"], terminal_width=200)
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    for word in NESTED[argv]:
        assert word in text, f"`aenv {' '.join(argv)} --help` lacks {word!r}:\n{r.output}"


def test_top_level_help_lists_the_command_groups() -> None:
    r = runner.invoke(app, ["--help"], terminal_width=200)
    for group in ("snapshot", "events", "keys"):
        assert f" {group} " in r.output
    for group, subs in (("snapshot", ("create", "ls", "rm")), ("keys", ("create", "ls", "revoke"))):
        text = runner.invoke(app, [group, "--help"], terminal_width=200).output
        assert all(f" {s} " in text for s in subs), text


@pytest.mark.parametrize(
    "argv",
    [
        ["events"],
        ["events", "-o", "yaml", "x"],
        ["snapshot", "rm"],
        ["snapshot", "create"],
        ["keys", "revoke"],
        ["keys", "ls", "-o", "csv"],
    ],
)
def test_new_commands_usage_errors_exit_2(argv: list[str], tmp_path: Path) -> None:
    env = {"AENV_API_URL": "http://127.0.0.1:9", "AENV_API_KEY": "e2b_x"}
    r = runner.invoke(
        app, [*argv, "--data-dir", str(tmp_path)] if argv[0] == "events" else argv, env=env
    )
    assert r.exit_code == 2, r.output


def test_operator_commands_without_a_stack_exit_3(tmp_path: Path) -> None:
    for argv in (["keys", "ls"], ["events", "x"], ["events", "--follow"]):
        r = runner.invoke(app, [*argv, "--data-dir", str(tmp_path)])
        assert r.exit_code == 3 and "aenv up" in r.output, r.output


@pytest.mark.parametrize(
    "argv", [["events", "x"], ["events", "--follow"], ["keys", "ls"], ["projections", "rebuild"]]
)
def test_an_unreachable_stack_exits_3_in_seconds_with_one_line(
    argv: list[str], tmp_path: Path
) -> None:
    """A stack.json whose services are gone (port 9 refuses): no endless NATS reconnects,
    no traceback."""
    import json
    import os
    import subprocess
    import sys

    (tmp_path / "stack.json").write_text(
        json.dumps(
            {
                "pid": os.getpid(),
                "nats_url": "nats://127.0.0.1:9",
                "database_url": "postgresql+asyncpg://u:p@127.0.0.1:9/x",
            }
        )
    )
    r = subprocess.run(
        [sys.executable, "-m", "aenv.cli", *argv, "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert r.returncode == 3, r.stderr
    assert r.stderr.startswith("aenv: ") and r.stderr.count("\n") == 1, r.stderr
