"""The files API in a real sandbox works with envd's rights, as E2B's does (issue 45): Harbor
uploads `/solution/...` and reads root's files as the default user `user`, unchanged.

What the SDK creates belongs to `user` (E2B's envd chowns it), while `user`'s processes
still meet the kernel: only the files API is root's.
"""

from __future__ import annotations

import pytest
from e2b import CommandExitException, FilesystemEventType, Sandbox

from tests.e2e.conftest import Stack
from tests.support import eventually_sync

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


def test_e2b_sdk_writes_and_watches_as_on_e2b(stack: Stack) -> None:
    """Two of E2B's own SDK tests, shortened, in a real guest: JS "write multiple files"
    (`/0/multi_test_file0.txt` as `user`: the missing parent is made, the user's) and
    Python `test_watch_iterated` (a new file's write is 3 events: CREATE, CHMOD, WRITE)."""
    sbx = Sandbox.create()
    try:
        files = sbx.files
        files.make_dir("watched")
        handle = files.watch_dir("watched")
        files.write("watched/f.txt", "This file will be watched.")
        events = eventually_sync(lambda: handle.get_new_events())
        events += handle.get_new_events()
        assert [(e.name, e.type) for e in events] == [
            ("f.txt", FilesystemEventType.CREATE),
            ("f.txt", FilesystemEventType.CHMOD),
            ("f.txt", FilesystemEventType.WRITE),
        ]
        handle.stop()

        infos = files.write_files(
            [
                {"path": "/0/multi_test_file0.txt", "data": "This is a test file 0."},
                {"path": "/home/user/multi_test_file1.txt", "data": "This is a test file 1."},
            ]
        )
        assert [i.path for i in infos] == [
            "/0/multi_test_file0.txt",
            "/home/user/multi_test_file1.txt",
        ]
        assert files.read("/0/multi_test_file0.txt") == "This is a test file 0."
        out = sbx.commands.run("stat -c '%U %a' /0 /0/multi_test_file0.txt").stdout
        assert out.split("\n")[:2] == ["user 755", "user 644"]
    finally:
        sbx.kill()
