"""`aenv start` and `aenv cn` on a real pseudo-terminal (pexpect): what a person at a
keyboard sees. Generous timeouts: a guest under TCG starts `bash -l` in about half a second,
and a resume restores the whole memory image first."""

from __future__ import annotations

import sys

import pexpect
import pytest

from tests.e2e.conftest import AENV
from tests.e2e_cli.conftest import CliStack, run_aenv

pytestmark = pytest.mark.vm

PROMPT = r"\$ "


def _spawn(stack: CliStack, *args: str) -> pexpect.spawn:
    child = pexpect.spawn(
        AENV[0], [*AENV[1:], *args], env=stack.env(), timeout=90, dimensions=(30, 100)
    )
    child.logfile_read = sys.stdout.buffer  # shown by pytest when a test fails
    return child


def test_start_opens_a_shell_that_ctrl_d_leaves(cli_stack: CliStack) -> None:
    child = _spawn(cli_stack, "start", "--rm")
    child.expect(r"sandbox (\w+) \(base\)")
    sid = child.match.group(1).decode()
    child.expect(PROMPT)
    child.sendline("echo h''i")  # the echoed input is `h''i`; only the output is `hi`
    child.expect("hi\r\n")
    child.sendline("stty size")
    child.expect("30 100")  # the guest PTY got our terminal's size
    child.setwinsize(40, 120)  # SIGWINCH → resize
    child.sendline("stty size")
    child.expect("40 120")
    child.expect(PROMPT)
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    ls = run_aenv("ls", env=cli_stack.env())
    assert sid.encode() not in ls.stdout  # --rm


def test_cn_resumes_a_paused_sandbox_and_reattaches(cli_stack: CliStack, sandbox: str) -> None:
    env = cli_stack.env()
    assert run_aenv("exec", sandbox, "--", "echo kept > /home/user/mark", env=env).returncode == 0
    assert run_aenv("pause", sandbox, env=env).returncode == 0
    child = _spawn(cli_stack, "cn", sandbox)
    child.expect(PROMPT)
    child.sendline("cat /home/user/mark")
    child.expect("kept\r\n")
    child.expect(PROMPT)
    child.sendline("exit 4")  # the shell's exit code is the CLI's, as with ssh
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 4
    assert b'"running"' in run_aenv("ls", env=env).stdout


def test_a_sandbox_killed_under_the_shell_ends_it_with_one_line(cli_stack: CliStack) -> None:
    child = _spawn(cli_stack, "start")
    child.expect(r"sandbox (\w+) \(base\)")
    sid = child.match.group(1).decode()
    child.expect(PROMPT)
    assert run_aenv("rm", sid, env=cli_stack.env()).returncode == 0
    child.expect("aenv: shell: the sandbox stopped running", timeout=30)  # idle check: every 3 s
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1
    assert b"keeps running" not in (child.before or b"")
