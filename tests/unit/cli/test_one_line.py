"""Usage errors through the `aenv` entry point are one line naming the command and its
`--help` (Typer's own: the usage, a hint and a box of several lines), exit 2; help and a
command's own exit code pass through."""

from __future__ import annotations

import sys

import pytest

from aenv.cli import main


def _run(monkeypatch: pytest.MonkeyPatch, *argv: str) -> int:
    monkeypatch.setattr(sys, "argv", ["aenv", *argv])
    with pytest.raises(SystemExit) as done:
        main()
    code = done.value.code
    return code if isinstance(code, int) else 1


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (("timeout", "x", "0"), "aenv: timeout: "),
        (("exec",), "aenv: exec: "),
        (("snapshot", "rm"), "aenv: snapshot rm: "),
        (("lss",), "Did you mean 'ls'"),
        (("ls", "-o", "yaml"), "aenv: ls: "),
        (("rm", "-s", "paused"), "aenv: -s narrows"),
    ],
)
def test_usage_errors_are_one_line(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: tuple[str, ...],
    names: str,
) -> None:
    monkeypatch.setenv("AENV_API_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AENV_API_KEY", "e2b_x")
    assert _run(monkeypatch, *argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and names in err and "╭" not in err, err


def test_help_and_exit_codes_pass_through(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(monkeypatch, "--help") == 0
    assert "Usage" in capsys.readouterr().out
    assert _run(monkeypatch, "ls", "--api-url", "http://127.0.0.1:9", "--api-key", "x") == 3
