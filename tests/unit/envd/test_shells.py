"""`commands.run` asks for /bin/bash; images without it run the command in what they have."""

from __future__ import annotations

from envd.shells import RUNTIME_BUSYBOX, resolve_argv

CMD = ["/bin/bash", "-l", "-c", "echo hi"]


def test_bash_is_used_where_the_image_has_it() -> None:
    assert resolve_argv(CMD, lambda p: True) == CMD


def test_an_image_without_bash_runs_the_command_in_its_sh() -> None:
    assert resolve_argv(CMD, lambda p: p == "/bin/sh") == ["/bin/sh", "-l", "-c", "echo hi"]


def test_an_image_without_a_shell_borrows_the_runtimes_busybox() -> None:
    got = resolve_argv(CMD, lambda p: p == RUNTIME_BUSYBOX)
    assert got == [RUNTIME_BUSYBOX, "sh", "-l", "-c", "echo hi"]


def test_other_programs_start_as_asked() -> None:
    assert resolve_argv(["/usr/bin/python3", "-V"], lambda p: False) == ["/usr/bin/python3", "-V"]
    assert resolve_argv([], lambda p: False) == []
