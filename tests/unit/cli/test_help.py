"""Every sandbox command documents itself: `--help` names its arguments and the options a
user needs, and bad usage exits 2 before anything talks to a server."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from aenv.cli import app

runner = CliRunner()

EXPECTED = {
    "auth": ["--api-url", "--api-key", "credentials"],
    "start": ["template", "--detach", "--timeout", "--rm", "--metadata"],
    "cn": ["sandbox_id", "paused"],
    "exec": ["sandbox_id", "command", "--cwd", "--env", "--interactive", "exit code"],
    "upload": ["sandbox_id", "local", "remote"],
    "download": ["sandbox_id", "remote", "local"],
    "ls": ["--output", "json", "--state", "--metadata"],
    "pause": ["sandbox_id"],
    "resume": ["sandbox_id", "--timeout"],
    "timeout": ["sandbox_id", "seconds"],
    "rm": ["sandbox_ids"],
    "fork": ["sandbox_id", "--count", "one per line"],
}


@pytest.mark.parametrize("command", sorted(EXPECTED))
def test_help_names_arguments_and_options(command: str) -> None:
    r = runner.invoke(app, [command, "--help"], terminal_width=200)
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
        assert f" {command} " in r.output


@pytest.mark.parametrize("argv", [["exec"], ["fork", "x", "-n", "0"], ["timeout", "x", "0"],
                                  ["ls", "-o", "yaml"], ["start", "-m", "novalue"]])  # fmt: skip
def test_usage_errors_exit_2(argv: list[str], tmp_path: object) -> None:
    env = {"AENV_API_URL": "http://127.0.0.1:9", "AENV_API_KEY": "e2b_x"}
    assert runner.invoke(app, argv, env=env).exit_code == 2


def test_top_level_help_explains_configuration_and_exit_codes() -> None:
    text = " ".join(runner.invoke(app, ["--help"], terminal_width=200).output.split())
    for word in ("AENV_API_URL", "aenv auth", "Exit codes", "--debug"):
        assert word in text
