"""The files API in a real sandbox works with envd's rights, as E2B's does (issue 45): Harbor
uploads `/solution/...` and reads root's files as the default user `user`, unchanged.

What the SDK creates belongs to `user` (E2B's envd chowns it), while `user`'s processes
still meet the kernel: only the files API is root's.
"""

from __future__ import annotations

import pytest
from e2b import CommandExitException, Sandbox

from tests.e2e.conftest import Stack

pytestmark = pytest.mark.vm


def _owners(sbx: Sandbox, *paths: str) -> list[str]:
    out = sbx.commands.run("stat -c %U " + " ".join(paths), user="root").stdout
    return out.split()


def test_files_api_acts_as_root_and_gives_to_the_user(stack: Stack) -> None:
    sbx = Sandbox.create()
    try:
        files = sbx.files
        assert sbx.commands.run("whoami").stdout == "user\n"
        sbx.commands.run(
            "printf secret > /root/secret && chmod 600 /root/secret && rm -rf /solution",
            user="root",
        )

        files.write("/root/x", "in root's home")
        files.write("/solution/a/b/solve.sh", "#!/bin/sh\necho solved\n")
        assert files.read("/root/x") == "in root's home"
        assert files.read("/root/secret") == "secret"  # 0600, root's
        assert {"x", "secret"} <= {e.name for e in files.list("/root")}
        made = ["/solution", "/solution/a", "/solution/a/b", "/solution/a/b/solve.sh"]
        assert _owners(sbx, "/root/x", *made) == ["user"] * 5
        assert _owners(sbx, "/root", "/root/secret") == ["root", "root"]

        files.make_dir("/opt/made/here")
        assert _owners(sbx, "/opt/made", "/opt/made/here") == ["user", "user"]
        files.remove("/opt/made")
        assert not files.exists("/opt/made")

        # the user's processes are still the user's: root's home stays closed to them
        with pytest.raises(CommandExitException):
            sbx.commands.run("touch /root/by-process")
        with pytest.raises(CommandExitException):
            sbx.commands.run("cat /root/secret")
        assert sbx.commands.run("sh /solution/a/b/solve.sh").stdout == "solved\n"
    finally:
        sbx.kill()
