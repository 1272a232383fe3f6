"""The CLI as a new user meets it (issue 18): piped input to a shell, and every message one
line that says what happened and what to do, with the exit code docs/cli.md gives."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.e2e_cli.conftest import CliStack, run_aenv

pytestmark = pytest.mark.vm


def _one_line(stderr: bytes) -> str:
    text = stderr.decode()
    assert text.startswith("aenv: ") and text.count("\n") == 1, text
    assert "Traceback" not in text
    return text


def test_piped_input_is_the_shells_script_and_its_end_ends_it(
    cli_stack: CliStack, sandbox: str, tmp_path: Path
) -> None:
    """`echo 'echo hi' | aenv start`: end of input acts as Ctrl-D (it hung until the
    sandbox's timeout, then said the sandbox was gone); as with ssh, no PTY: output and
    errors apart, the exit code the shell's."""
    env = cli_stack.env()
    r = run_aenv("start", "--rm", env=env, stdin=b"echo hi\n")
    assert (r.returncode, r.stdout) == (0, b"hi\n"), r.stderr.decode()
    sid = r.stderr.decode().split()[2]  # "aenv: sandbox ID (base); …"
    assert sid.encode() not in run_aenv("ls", env=env).stdout  # --rm

    script = tmp_path / "script.sh"
    script.write_text("cd /tmp\npwd\necho to-err >&2\nexit 5\n")
    with open(script, "rb") as f:
        r = run_aenv("cn", sandbox, env=env, stdin=f.read())
    assert (r.returncode, r.stdout, r.stderr) == (5, b"/tmp\n", b"to-err\n")


def test_messages_say_what_happened_and_what_to_do(
    cli_stack: CliStack, sandbox: str, tmp_path: Path
) -> None:
    env = cli_stack.env()
    # an unknown sandbox is that, whichever verb met it (not "Paused sandbox … not found")
    for argv in (("exec", "nosuch", "--", "true"), ("cn", "nosuch"), ("resume", "nosuch"),
                 ("pause", "nosuch"), ("timeout", "nosuch"), ("fork", "nosuch"),
                 ("download", "nosuch", "/x", str(tmp_path))):  # fmt: skip
        r = run_aenv(*argv, env=env)
        assert r.returncode == 1, argv
        assert "no such sandbox nosuch" in _one_line(r.stderr) and "aenv ls" in r.stderr.decode()

    # a command past its --timeout: said so (not the SDK's hint at `request_timeout`), its
    # process killed (it printed nothing more), exit 124 as timeout(1)
    began = time.monotonic()
    r = run_aenv("exec", "-t", "2", sandbox, "--", "sleep 30; echo late", env=env)
    assert r.returncode == 124 and r.stdout == b""
    said = _one_line(r.stderr)
    assert "timed out after 2 s" in said and "request_timeout" not in said
    assert time.monotonic() - began < 25

    # directories: local or in the sandbox, said as such, with what to type instead
    (tmp_path / "d").mkdir()
    r = run_aenv("upload", sandbox, str(tmp_path / "d"), "/home/user/", env=env)
    said = _one_line(r.stderr)
    assert r.returncode == 2 and "is a directory" in said and "tar" in said
    (tmp_path / "f").write_text("x")
    r = run_aenv("upload", sandbox, str(tmp_path / "f"), "/home/user", env=env)
    assert r.returncode == 2 and "/home/user/" in _one_line(r.stderr)
    r = run_aenv("download", sandbox, "/home/user", str(tmp_path), env=env)
    assert r.returncode == 2 and "is a directory" in _one_line(r.stderr)
    r = run_aenv("upload", sandbox, str(tmp_path / "nope"), "/x", env=env)
    assert r.returncode == 1 and "no such file" in _one_line(r.stderr)
