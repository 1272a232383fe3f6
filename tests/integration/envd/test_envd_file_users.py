"""The files API acts as the request's user (issue 16 #12): the kernel's permission checks
apply to what envd — root — reads, writes, lists, moves and removes on a user's behalf.

envd runs as root here, as in the guest; requests name the throwaway `aenvtest` user (the
default user of the shared envd) or `root`, and the files they touch are set up as root.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox, SandboxException

from tests.integration.envd.conftest import Envd

pytestmark = [
    pytest.mark.timeout(30),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: envd switches to another user"),
]
DENIED = "(?i)permission denied"


@pytest.fixture
def root_dirs() -> Iterator[tuple[str, str]]:
    """(private, readonly): root's 0700 directory with a secret in it, and root's 0755
    directory with a file in it, which others can read but not change."""
    base = f"/tmp/aenv-root-{uuid.uuid4().hex[:10]}"
    private, readonly = f"{base}/private", f"{base}/readonly"
    os.makedirs(private, 0o700)
    os.chmod(base, 0o755)
    os.chmod(private, 0o700)
    os.makedirs(readonly, 0o755)
    for d in (private, readonly):
        with open(f"{d}/file.txt", "w") as f:
            f.write("root's")
        os.chmod(f"{d}/file.txt", 0o644)
    yield private, readonly
    shutil.rmtree(base, ignore_errors=True)


def test_reading_etc_shadow_as_the_user_is_refused(envd: Envd, sandbox: Sandbox) -> None:
    url, token = f"{envd.url}/files", {"X-Access-Token": envd.token or ""}
    r = httpx.get(url, params={"path": "/etc/shadow"}, headers=token)  # the default user
    assert r.status_code == 403, r.status_code  # not r.text: it would be the shadow file
    body = r.json()
    assert body["code"] == 403 and "permission denied" in body["message"]
    r = httpx.get(url, params={"path": "/etc/shadow", "username": envd.user}, headers=token)
    assert r.status_code == 403
    assert (
        httpx.get(
            url, params={"path": "/etc/shadow", "username": "root"}, headers=token
        ).status_code
        == 200
    )
    with pytest.raises(SandboxException, match=DENIED):
        sandbox.files.read("/etc/shadow")
    shadow = sandbox.files.read("/etc/shadow", format="bytes", user="root")
    with open("/etc/shadow", "rb") as f:
        assert hashlib.sha256(shadow).digest() == hashlib.sha256(f.read()).digest()


def test_writes_need_the_users_permission(
    sandbox: Sandbox, root_dirs: tuple[str, str], workdir: str, test_user: str
) -> None:
    private, readonly = root_dirs
    for target in (
        f"{private}/new.txt",
        f"{readonly}/new.txt",
        f"{readonly}/sub/new.txt",
        f"{readonly}/file.txt",
    ):
        with pytest.raises(SandboxException, match=DENIED):
            sandbox.files.write(target, "x")
        with pytest.raises(SandboxException, match=DENIED):
            sandbox.files.write(target, iter([b"x"]))  # the octet-stream upload
    assert not os.path.exists(f"{readonly}/new.txt") and not os.path.exists(f"{readonly}/sub")
    assert Path(f"{readonly}/file.txt").read_text() == "root's"
    # what the user may write is written, and is the user's, parents included
    sandbox.files.write(f"{workdir}/a/b/c.txt", "mine")
    for p in (f"{workdir}/a", f"{workdir}/a/b", f"{workdir}/a/b/c.txt"):
        assert pwd.getpwuid(os.stat(p).st_uid).pw_name == test_user
    # as root, root's directory takes the file, and root owns it
    sandbox.files.write(f"{readonly}/by-root.txt", "r", user="root")
    assert os.stat(f"{readonly}/by-root.txt").st_uid == 0


def test_filesystem_rpcs_act_as_the_user(sandbox: Sandbox, root_dirs: tuple[str, str]) -> None:
    private, readonly = root_dirs
    files = sandbox.files
    with pytest.raises(SandboxException, match=DENIED):
        files.get_info(f"{private}/file.txt")
    with pytest.raises(SandboxException, match=DENIED):
        files.list(private)
    with pytest.raises(SandboxException, match=DENIED):
        files.make_dir(f"{readonly}/newdir")
    with pytest.raises(SandboxException, match=DENIED):
        files.rename(f"{readonly}/file.txt", f"{readonly}/moved.txt")
    with pytest.raises(SandboxException, match=DENIED):
        files.remove(f"{readonly}/file.txt")
    with pytest.raises(SandboxException, match=DENIED):
        files.watch_dir(private)
    assert os.path.exists(f"{readonly}/file.txt") and not os.path.exists(f"{readonly}/newdir")
    # what others may read, the user may list and stat
    assert [e.name for e in files.list(readonly)] == ["file.txt"]
    assert files.get_info(f"{readonly}/file.txt").size == len("root's")
    # and root may do all of it (Basic-auth user on the RPCs)
    assert [e.name for e in files.list(private, user="root")] == ["file.txt"]
    assert files.get_info(f"{private}/file.txt", user="root").owner == "root"
    files.rename(f"{readonly}/file.txt", f"{readonly}/moved.txt", user="root")
    files.remove(f"{readonly}/moved.txt", user="root")
    assert not os.path.exists(f"{readonly}/moved.txt")


def test_a_long_listing_crosses_back_whole(sandbox: Sandbox, workdir: str) -> None:
    """The child's answer is larger than one socket read (~600 KiB of EntryInfo JSON)."""
    names = [f"{i:05d}-" + "n" * 200 for i in range(1500)]
    for name in names:
        Path(workdir, name).touch()
    assert [e.name for e in sandbox.files.list(workdir)] == names
