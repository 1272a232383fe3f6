"""The non-interactive CLI against a real stack, as a script would use it: output shapes,
exit codes, streams kept apart, files round-tripped byte for byte."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from tests.e2e_cli.conftest import CliStack, run_aenv

pytestmark = pytest.mark.vm


def _ls(stack: CliStack, *args: str) -> dict[str, dict[str, object]]:
    r = run_aenv("ls", *args, env=stack.env())  # piped: JSON without asking
    assert r.returncode == 0, r.stderr.decode()
    return {row["sandbox_id"]: row for row in json.loads(r.stdout)}


def test_lifecycle_exec_files_pause_timeout_fork_rm(cli_stack: CliStack, tmp_path: Path) -> None:
    env = cli_stack.env()
    r = run_aenv("start", "-d", "-m", "suite=cli", "--timeout", "600", env=env)
    assert r.returncode == 0, r.stderr.decode()
    sid = r.stdout.decode().strip()
    children: list[str] = []
    try:
        listed = _ls(cli_stack, "-m", "suite=cli")
        assert listed[sid]["state"] == "running" and listed[sid]["metadata"] == {"suite": "cli"}
        assert sid not in _ls(cli_stack, "-m", "suite=other")

        # exec: streams kept apart, the guest's exit code is ours, one-arg shell lines work
        r = run_aenv("exec", sid, "--", "sh", "-c", "echo to-out; echo to-err >&2; exit 7", env=env)
        assert (r.returncode, r.stdout, r.stderr) == (7, b"to-out\n", b"to-err\n")
        r = run_aenv("exec", sid, "--", "echo hello | tr a-z A-Z", env=env)
        assert (r.returncode, r.stdout) == (0, b"HELLO\n")
        r = run_aenv("exec", sid, "--", "python3", "-c", "print('--debug')", env=env)
        assert (r.returncode, r.stdout) == (0, b"--debug\n")  # after `--`, flags are the guest's
        r = run_aenv("exec", "-i", sid, "--", "wc -c", env=env, stdin=b"x" * 100_000)
        assert (r.returncode, r.stdout.strip()) == (0, b"100000")  # -i: stdin in, then EOF

        # upload/download: a binary file survives the round trip unchanged
        blob = os.urandom(1 << 20)
        (tmp_path / "in.bin").write_bytes(blob)
        r = run_aenv("upload", sid, str(tmp_path / "in.bin"), "/home/user/up/", env=env)
        assert r.returncode == 0, r.stderr.decode()
        r = run_aenv("download", sid, "/home/user/up/in.bin", str(tmp_path), env=env)
        assert r.returncode == 0, r.stderr.decode()
        assert (tmp_path / "in.bin").read_bytes() == blob
        # from a pipe: every byte, not the 0 a pipe's fstat reports (issue 16 #11)
        r = run_aenv("upload", sid, "-", "/home/user/up/piped.bin", env=env, stdin=blob * 3)
        assert r.returncode == 0, r.stderr.decode()
        r = run_aenv("exec", sid, "--", "sha256sum < /home/user/up/piped.bin", env=env)
        assert r.stdout.split()[0].decode() == hashlib.sha256(blob * 3).hexdigest()
        r = run_aenv("download", sid, "/home/user/nope", str(tmp_path / "x"), env=env)
        assert r.returncode == 1 and r.stderr.decode().count("\n") == 1

        # timeout: set, then read back
        assert run_aenv("timeout", sid, "900", env=env).returncode == 0
        left = int(run_aenv("timeout", sid, env=env).stdout)
        assert 850 < left <= 900

        # pause/resume: state follows, the file is still there after
        assert run_aenv("pause", sid, env=env).returncode == 0
        assert _ls(cli_stack)[sid]["state"] == "paused"
        assert _ls(cli_stack, "--state", "running").get(sid) is None
        assert run_aenv("resume", sid, env=env).returncode == 0
        assert _ls(cli_stack)[sid]["state"] == "running"
        r = run_aenv("exec", sid, "--", "cat /home/user/up/in.bin | sha256sum", env=env)
        assert r.stdout.split()[0].decode() == hashlib.sha256(blob).hexdigest()

        # fork: one child ID per line, each with the parent's files
        r = run_aenv("fork", sid, "-n", "2", env=env)
        assert r.returncode == 0, r.stderr.decode()
        children = r.stdout.decode().split()
        assert len(children) == 2 and len(set(children)) == 2 and sid not in children
        for child in children:
            r = run_aenv("exec", child, "--", "test -s /home/user/up/in.bin", env=env)
            assert r.returncode == 0
    finally:
        r = run_aenv("rm", sid, *children, env=env)
    assert r.returncode == 0, r.stderr.decode()
    assert not {sid, *children} & set(_ls(cli_stack))
    r = run_aenv("rm", sid, env=env)
    assert r.returncode == 1 and b"no such sandbox" in r.stderr


def test_table_on_request_and_errors_in_one_line(cli_stack: CliStack, sandbox: str) -> None:
    r = run_aenv("ls", "-o", "table", env=cli_stack.env(COLUMNS="200"))
    assert r.returncode == 0
    header, *rows = r.stdout.decode().splitlines()
    assert header.split()[:3] == ["SANDBOX", "ID", "TEMPLATE"]
    assert any(row.split()[0] == sandbox for row in rows)
    r = run_aenv("exec", "no-such-sandbox", "--", "true", env=cli_stack.env())
    assert r.returncode == 1
    assert r.stderr.decode().startswith("aenv: ") and r.stderr.count(b"\n") == 1


def test_unreachable_server_exits_3_with_one_line(cli_stack: CliStack) -> None:
    env = cli_stack.bare_env(E2B_CONNECTION_RETRIES="0")
    args = ("ls", "--api-url", "http://127.0.0.1:9", "--api-key", "e2b_00")
    r = run_aenv(*args, env=env)
    err = r.stderr.decode()
    assert r.returncode == 3
    assert err.count("\n") == 1 and "cannot reach" in err and "Traceback" not in err
    r = run_aenv("--debug", *args, env=env)
    assert r.returncode != 0 and b"Traceback" in r.stderr


def test_usage_error_exits_2(cli_stack: CliStack) -> None:
    r = run_aenv("fork", "x", "-n", "0", env=cli_stack.env())
    assert r.returncode == 2 and b"Traceback" not in r.stderr
    r = run_aenv("ls", "--data-dir", "/nonexistent", env=cli_stack.bare_env())
    assert r.returncode == 2 and b"aenv auth" in r.stderr


def test_auth_then_commands_use_the_credentials_file(cli_stack: CliStack, tmp_path: Path) -> None:
    env = cli_stack.bare_env(HOME=str(tmp_path))
    none = ("--data-dir", str(tmp_path / "no-stack"))
    r = run_aenv("auth", "--api-url", cli_stack.api_url, "--api-key", "e2b_wrong", env=env)
    assert r.returncode == 3 and b"authentication" in r.stderr
    r = run_aenv("auth", "--api-url", cli_stack.api_url, "--api-key", cli_stack.api_key, env=env)
    assert r.returncode == 0, r.stderr.decode()
    creds = tmp_path / ".config" / "aenv" / "credentials"
    assert creds.stat().st_mode & 0o777 == 0o600
    assert run_aenv("ls", *none, env=env).returncode == 0
    # the variables still win over the file
    bad = {**env, "AENV_API_URL": "http://127.0.0.1:9", "E2B_CONNECTION_RETRIES": "0"}
    assert run_aenv("ls", *none, env=bad).returncode == 3


def test_a_running_local_stack_needs_no_configuration(cli_stack: CliStack) -> None:
    r = run_aenv("ls", "--data-dir", str(cli_stack.data_dir), env=cli_stack.bare_env())
    assert r.returncode == 0, r.stderr.decode()
    assert isinstance(json.loads(r.stdout), list)
