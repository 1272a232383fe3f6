"""The CLI as a new user meets it (issue 18): piped input to a shell, and every message one
line that says what happened and what to do, with the exit code docs/cli.md gives."""

from __future__ import annotations

import json
import time
import uuid
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
    for argv in (
        ("exec", "nosuch", "--", "true"),
        ("cn", "nosuch"),
        ("resume", "nosuch"),
        ("pause", "nosuch"),
        ("timeout", "nosuch"),
        ("fork", "nosuch"),
        ("download", "nosuch", "/x", str(tmp_path)),
    ):
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

    # an unknown template; a user the image lacks (envd's, not the API key refused)
    r = run_aenv("start", "-d", "no-such-template", env=env)
    assert r.returncode == 1 and "aenv template ls" in _one_line(r.stderr)
    r = run_aenv("exec", "-u", "nobodyx", sandbox, "--", "true", env=env)
    assert r.returncode == 2 and "-u" in _one_line(r.stderr) and "API key" not in r.stderr.decode()
    # usage errors: one line too, naming the command's help
    r = run_aenv("timeout", sandbox, "0", env=env)
    assert r.returncode == 2 and "aenv timeout --help" in _one_line(r.stderr)


def _rows(stack: CliStack, *args: str) -> dict[str, dict[str, object]]:
    r = run_aenv("ls", *args, env=stack.env())  # piped: JSON without asking
    assert r.returncode == 0, r.stderr.decode()
    return {row["sandbox_id"]: row for row in json.loads(r.stdout)}


def test_info_rm_by_metadata_and_the_time_a_paused_sandbox_keeps(cli_stack: CliStack) -> None:
    """E2B's CLI verbs `sandbox info` and `sandbox kill -a/-m`, a fork child's timeout (its
    parent's, from the CLI too), and a paused sandbox's time left: what it kept, the same
    in `ls`, `info` and `timeout`, unchanged while paused, and what `resume` gives it — not
    `EXPIRES IN -19m08s`."""
    env = cli_stack.env()
    tag = f"suite=verbs-{uuid.uuid4().hex[:6]}"
    ids = []
    for _ in range(2):
        r = run_aenv("start", "-d", "-m", tag, "-t", "700", env=env)
        assert r.returncode == 0, r.stderr.decode()
        ids.append(r.stdout.decode().strip())
    running, paused = ids
    try:
        r = run_aenv("fork", running, env=env)
        assert r.returncode == 0, r.stderr.decode()
        child = r.stdout.decode().strip()
        assert 660 <= int(run_aenv("timeout", child, env=env).stdout) <= 700

        assert run_aenv("pause", paused, env=env).returncode == 0
        r = run_aenv("fork", paused, env=env)  # its state forbids it: what to do first
        assert r.returncode == 1 and f"aenv resume {paused}" in _one_line(r.stderr)
        kept = int(run_aenv("timeout", paused, env=env).stdout)
        assert 640 <= kept <= 700
        assert _rows(cli_stack, "-m", tag)[paused]["remaining_s"] == kept
        table = run_aenv("ls", "-o", "table", "-m", tag, env=cli_stack.env(COLUMNS="200"))
        [line] = [ln for ln in table.stdout.decode().splitlines() if ln.startswith(paused)]
        assert "(paused)" in line and " -" not in line, line
        time.sleep(2)  # paused time does not consume it
        assert int(run_aenv("timeout", paused, env=env).stdout) == kept

        r = run_aenv("info", paused, "-o", "json", env=env)
        assert r.returncode == 0, r.stderr.decode()
        got = json.loads(r.stdout)
        assert (got["state"], got["template"], got["node_id"]) == ("paused", "base", "cli")
        assert got["remaining_s"] == kept and got["disk_mb"] > 0 and got["metadata"]
        assert "envdAccessToken" not in r.stdout.decode()
        r = run_aenv("info", running, "-o", "table", env=cli_stack.env(COLUMNS="200"))
        fields = dict(ln.split(None, 1) for ln in r.stdout.decode().splitlines()[1:] if ln)
        assert fields["state"].strip() == "running" and fields["node"].strip() == "cli"
        assert "MiB" in fields["memory"] and "MiB" in fields["disk"]
        r = run_aenv("info", "nosuch", env=env)
        assert r.returncode == 1 and "no such sandbox" in _one_line(r.stderr)

        assert run_aenv("resume", paused, env=env).returncode == 0  # for the time it kept
        assert kept - 10 <= int(run_aenv("timeout", paused, env=env).stdout) <= kept
    finally:
        r = run_aenv("rm", "--all", "-m", tag, env=env)
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode().startswith("killed 3 ") and not _rows(cli_stack, "-m", tag)
    r = run_aenv("rm", "-m", tag, env=env)
    assert (r.returncode, r.stdout.decode().split()[:2]) == (0, ["killed", "0"])
    r = run_aenv("rm", "-s", "paused", env=env)
    assert r.returncode == 2 and "--all" in _one_line(r.stderr)


def test_template_logs_of_a_template_never_built_says_why(cli_stack: CliStack) -> None:
    r = run_aenv("template", "logs", "base", env=cli_stack.env())
    assert r.returncode == 1 and "no build log" in _one_line(r.stderr)
