"""The files API works with envd's rights and gives what it creates to the request's user,
as E2B's envd does (issue 45: Harbor uploads `/solution/solve.sh` as the default `user`).

envd runs as root here, as in the guest; requests name the throwaway `aenvtest` user (the
default user of the shared envd) or `root`, and the files they touch are set up as root.
The user's own processes still meet the kernel's checks. One test runs a second envd as
`aenvtest`: not root, it cannot give files away, and must not try.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import CommandExitException, InvalidArgumentException, Sandbox, SandboxException

from tests.integration.envd.conftest import (
    GUEST_PYTHON,
    REPO,
    Envd,
    init_envd,
    make_sandbox,
    stop_envd,
)

pytestmark = [
    pytest.mark.timeout(30),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: envd gives files to a user"),
]


@pytest.fixture
def root_dirs() -> Iterator[tuple[str, str]]:
    """(private, readonly): root's 0700 directory with a 0600 secret in it, and root's 0755
    directory with a file in it, which others can read but not change."""
    base = f"/tmp/aenv-root-{uuid.uuid4().hex[:10]}"
    private, readonly = f"{base}/private", f"{base}/readonly"
    os.makedirs(private, 0o700)
    os.chmod(base, 0o755)
    os.chmod(private, 0o700)
    os.makedirs(readonly, 0o755)
    for d, mode in ((private, 0o600), (readonly, 0o644)):
        with open(f"{d}/file.txt", "w") as f:
            f.write("root's")
        os.chmod(f"{d}/file.txt", mode)
    yield private, readonly
    shutil.rmtree(base, ignore_errors=True)


def _owner(path: str) -> str:
    return pwd.getpwuid(os.stat(path).st_uid).pw_name


def test_root_only_files_are_read_for_the_user(
    envd: Envd, sandbox: Sandbox, root_dirs: tuple[str, str]
) -> None:
    private, _ = root_dirs
    secret = f"{private}/file.txt"
    r = httpx.get(
        f"{envd.url}/files", params={"path": secret}, headers={"X-Access-Token": envd.token or ""}
    )
    assert (r.status_code, r.text) == (200, "root's")
    assert sandbox.files.read(secret) == "root's"
    assert sandbox.files.read(secret, user="root") == "root's"


def test_writes_anywhere_belong_to_the_user(
    sandbox: Sandbox, root_dirs: tuple[str, str], test_user: str
) -> None:
    private, readonly = root_dirs
    sandbox.files.write(f"{private}/new.txt", "x")
    sandbox.files.write(f"{readonly}/sub/deeper/new.txt", iter([b"y"]))  # octet-stream
    assert Path(f"{private}/new.txt").read_text() == "x"
    for p in (
        f"{private}/new.txt",
        f"{readonly}/sub",
        f"{readonly}/sub/deeper",
        f"{readonly}/sub/deeper/new.txt",
    ):
        assert _owner(p) == test_user, p
    assert os.stat(f"{readonly}/sub").st_mode & 0o777 == 0o755
    # the directories that were there keep their owner
    assert (_owner(private), _owner(readonly)) == ("root", "root")
    # an overwritten file is the user's afterwards (E2B chowns it), its metadata replaced
    sandbox.files.write(f"{readonly}/file.txt", "mine", metadata={"k": "v"})
    assert Path(f"{readonly}/file.txt").read_text() == "mine"
    assert _owner(f"{readonly}/file.txt") == test_user
    assert sandbox.files.get_info(f"{readonly}/file.txt").metadata == {"k": "v"}
    # as root, the file is root's, also one the user owned
    sandbox.files.write(f"{readonly}/file.txt", "r", user="root")
    assert _owner(f"{readonly}/file.txt") == "root"


@pytest.fixture
def top_dirs() -> Iterator[list[str]]:
    """Names of directories at / that do not exist yet, removed afterwards."""
    made = [f"/aenv-{uuid.uuid4().hex[:8]}-{i}" for i in range(2)]
    yield made
    for d in made:
        shutil.rmtree(d, ignore_errors=True)


def test_writes_at_the_root_make_the_users_parents(
    sandbox: Sandbox, top_dirs: list[str], test_user: str, home: str
) -> None:
    """E2B's JS test "write multiple files": one multipart upload as the default user with
    files in missing directories at / (`/0/multi_test_file0.txt`) and in the home. E2B's
    envd (EnsureDirs) makes each missing parent 0755 and the user's; so does envd."""
    files = [
        {"path": f"{top_dirs[0]}/multi_test_file0.txt", "data": "This is a test file 0."},
        {"path": f"{home}/multi_test_file1.txt", "data": "This is a test file 1."},
        {"path": f"{top_dirs[1]}/a/multi_test_file2.txt", "data": "This is a test file 2."},
    ]
    umask = os.umask(0o022)  # envd's is the test process's: it started envd
    os.umask(umask)
    infos = sandbox.files.write_files(files)  # type: ignore[arg-type]
    assert [(i.path, i.name) for i in infos] == [
        (f["path"], os.path.basename(f["path"])) for f in files
    ]
    for f in files:
        assert sandbox.files.read(f["path"]) == f["data"]
        assert _owner(f["path"]) == test_user
        assert os.stat(f["path"]).st_mode & 0o777 == 0o666 & ~umask  # E2B's OpenFile mode
    for d in (top_dirs[0], top_dirs[1], f"{top_dirs[1]}/a"):
        assert (_owner(d), os.stat(d).st_mode & 0o777) == (test_user, 0o755 & ~umask), d
    sandbox.files.remove(f"{home}/multi_test_file1.txt")


def test_a_parent_that_cannot_be_made_is_a_500_as_on_e2b(
    envd: Envd, sandbox: Sandbox, workdir: str
) -> None:
    """A file where a parent should be: E2B answers 500 "error ensuring directories: path
    is a file: …" (the SDK's SandboxException, not InvalidArgumentException); a directory
    at the path itself is the client's mistake, a 400."""
    Path(workdir, "plain").write_text("a file")
    with pytest.raises(SandboxException, match="path is a file") as err:
        sandbox.files.write(f"{workdir}/plain/sub/x.txt", "x")
    assert not isinstance(err.value, InvalidArgumentException)
    r = httpx.post(
        f"{envd.url}/files",
        params={"path": f"{workdir}/plain/x.txt"},
        files={"file": ("x.txt", b"x")},
        headers={"X-Access-Token": envd.token or ""},
    )
    assert r.status_code == 500, r.text
    assert r.json()["message"] == f"error ensuring directories: path is a file: {workdir}/plain"
    with pytest.raises(InvalidArgumentException, match="is a directory"):
        sandbox.files.write(workdir, "x")


def test_the_users_processes_still_meet_the_kernel(
    sandbox: Sandbox, root_dirs: tuple[str, str]
) -> None:
    private, readonly = root_dirs
    for cmd in (f"cat {private}/file.txt", f"touch {readonly}/by-process"):
        with pytest.raises(CommandExitException, match=r"(?i)permission denied"):
            sandbox.commands.run(cmd)
    assert not os.path.exists(f"{readonly}/by-process")


def test_filesystem_rpcs_work_with_envds_rights(
    sandbox: Sandbox, root_dirs: tuple[str, str], test_user: str
) -> None:
    private, readonly = root_dirs
    files = sandbox.files
    assert files.get_info(f"{private}/file.txt").owner == "root"
    assert [e.name for e in files.list(private)] == ["file.txt"]
    files.make_dir(f"{readonly}/newdir/inner")
    assert _owner(f"{readonly}/newdir") == _owner(f"{readonly}/newdir/inner") == test_user
    files.rename(f"{readonly}/file.txt", f"{readonly}/moved/here.txt")
    assert _owner(f"{readonly}/moved") == test_user
    assert _owner(f"{readonly}/moved/here.txt") == "root"  # a move keeps the owner
    files.remove(f"{readonly}/moved/here.txt")
    Path(f"{readonly}/newdir/inner/f").write_text("x")
    files.remove(f"{readonly}/newdir")  # a tree: removed in a child
    assert sorted(os.listdir(readonly)) == ["moved"]
    # a link to a directory: the link goes, not what it points to
    os.symlink(private, f"{readonly}/link")
    files.remove(f"{readonly}/link")
    assert os.path.exists(f"{private}/file.txt") and not os.path.lexists(f"{readonly}/link")
    w = files.watch_dir(private)
    w.stop()


def test_a_long_listing_crosses_back_whole(sandbox: Sandbox, workdir: str) -> None:
    """The child's answer is larger than one socket read (~600 KiB of EntryInfo JSON)."""
    names = [f"{i:05d}-" + "n" * 200 for i in range(1500)]
    for name in names:
        Path(workdir, name).touch()
    assert [e.name for e in sandbox.files.list(workdir)] == names


def test_envd_not_root_writes_without_giving_away(test_user: str, workdir: str) -> None:
    """envd as `aenvtest` (as on a developer's host): a request as root — any user but
    envd's — writes where envd may, and the file stays envd's user's (no chown to try)."""
    pw = pwd.getpwnam(test_user)
    proc = subprocess.Popen(
        [GUEST_PYTHON, "-m", "envd", "--host", "127.0.0.1", "--port", "0"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        user=pw.pw_uid,
        group=pw.pw_gid,
        extra_groups=[],
        env={"PATH": os.environ["PATH"], "HOME": pw.pw_dir},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("ENVD-READY "), line
    own = Envd(proc, int(line.split()[1]), None, test_user)
    try:
        init_envd(own, "tok-" + uuid.uuid4().hex)
        sbx = make_sandbox(own, own.token)
        sbx.files.write(f"{workdir}/a/b.txt", "z", user="root")
        sbx.files.make_dir(f"{workdir}/c/d", user="root")
        for p in (f"{workdir}/a", f"{workdir}/a/b.txt", f"{workdir}/c/d"):
            assert _owner(p) == test_user, p
    finally:
        stop_envd(own)
