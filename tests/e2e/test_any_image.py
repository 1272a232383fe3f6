"""Whatever a registry image holds, the sandbox made from it does everything an agent does
through the unchanged e2b SDK: commands, a background process killed, files written, read,
listed and watched, a PTY. envd brings its own runtime, so none of these depend on the image:

- busybox only: no libc, no Python, no bash;
- Debian (glibc, bash, coreutils) whose `/usr/bin/python3` is a script that exits 1, behind
  a registry login, with its own USER, WORKDIR and ENV;
- three layers with whiteouts (a file, a directory, an opaque directory) and hard links.

Every image is made here from a tree the test builds and pushed to a `docker-registry` on
loopback."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import CommandExitException, Sandbox, Template
from e2b.sandbox.commands.command_handle import PtySize

from tests.e2e.conftest import Stack
from tests.registry import LocalRegistry, busybox_tree, debian_tree, layout, local_registry, push
from tests.support import eventually_sync

pytestmark = pytest.mark.vm

BROKEN_PYTHON = "#!/bin/sh\nexit 1\n"
COREUTILS = ("bash", "ls", "cat", "id", "sleep", "uname", "stat", "env", "mkdir", "rm", "tty")


@pytest.fixture(scope="module")
def registries(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalRegistry, ...]]:
    root = tmp_path_factory.mktemp("registries")
    with (
        local_registry(root / "open") as open_reg,
        local_registry(root / "private", login=("rl", "pa55")) as private,
    ):
        yield open_reg, private


def _sandbox_from(ref: str, **login: str) -> Sandbox:
    name = f"img-{uuid.uuid4().hex[:8]}"
    Template.build(Template().from_image(ref, **login), name)
    return Sandbox.create(name)


def _read_pty_until(handle: object, needle: bytes) -> bytes:
    seen = bytearray()
    for _, _, pty in handle:  # type: ignore[attr-defined]
        if pty:
            seen += pty
            if needle in seen:
                return bytes(seen)
    raise AssertionError(f"{needle!r} never arrived on the PTY; got {bytes(seen)!r}")


def _everything_an_agent_does(sbx: Sandbox, home: str) -> None:
    assert sbx.commands.run("echo hi from $(uname -s)").stdout == "hi from Linux\n"
    with pytest.raises(CommandExitException) as failed:
        sbx.commands.run("echo to-stderr >&2; exit 3")
    assert (failed.value.exit_code, failed.value.stderr) == (3, "to-stderr\n")

    bg = sbx.commands.run("sleep 600", background=True)
    assert bg.pid in [p.pid for p in sbx.commands.list()]
    assert bg.kill()
    with pytest.raises(CommandExitException):
        bg.wait()
    eventually_sync(lambda: bg.pid not in [p.pid for p in sbx.commands.list()])

    watcher = sbx.files.watch_dir(home)
    seen: list[str] = []
    sbx.files.write(f"{home}/notes/f.txt", "through envd\n")
    assert sbx.files.read(f"{home}/notes/f.txt") == "through envd\n"
    assert [e.name for e in sbx.files.list(f"{home}/notes")] == ["f.txt"]
    assert sbx.commands.run(f"cat {home}/notes/f.txt").stdout == "through envd\n"

    def watched() -> bool:
        seen.extend(e.name for e in watcher.get_new_events())
        return "notes" in seen

    eventually_sync(watched)
    watcher.stop()

    term = sbx.pty.create(PtySize(rows=24, cols=80))
    sbx.pty.send_stdin(term.pid, b"tty >/dev/null && echo pty-$((40+2)); exit 0\n")
    _read_pty_until(term, b"pty-42")
    assert term.wait().exit_code == 0


def test_busybox_only_image(
    stack: Stack, registries: tuple[LocalRegistry, ...], tmp_path: Path
) -> None:
    tree = busybox_tree(tmp_path / "tree", "stat", "mkdir", "rm", "tty")
    sbx = _sandbox_from(push(layout(tmp_path / "img", tree), registries[0], "any/busybox"))
    try:
        assert sbx.commands.run("id -un; ls /usr/bin/python3 || echo no-python").stdout == (
            "user\nno-python\n"
        )
        _everything_an_agent_does(sbx, "/home/user")
    finally:
        sbx.kill()


def test_debian_image_with_a_python3_that_exits_1(
    stack: Stack, registries: tuple[LocalRegistry, ...], tmp_path: Path
) -> None:
    tree = debian_tree(tmp_path / "tree", *COREUTILS)
    (tree / "usr/bin/python3").write_text(BROKEN_PYTHON)
    (tree / "usr/bin/python3").chmod(0o755)
    (tree / "etc/passwd").write_text(
        "root:x:0:0:root:/root:/bin/bash\napp:x:1000:1000::/home/app:/bin/bash\n"
    )
    (tree / "etc/group").write_text("root:x:0:\napp:x:1000:\n")
    for d in ("home/app", "work"):
        (tree / d).mkdir()
        os.chown(tree / d, 1000, 1000)
    env = ["IMAGE_KIND=debian", "PATH=/usr/local/bin:/usr/bin:/bin"]
    config: dict[str, object] = {"config": {"User": "app", "WorkingDir": "/work", "Env": env}}
    private = registries[1]
    ref = push(layout(tmp_path / "img", tree, config=config), private, "any/debian")
    sbx = _sandbox_from(ref, username="rl", password="pa55")
    try:
        out = sbx.commands.run("pwd; echo $IMAGE_KIND; id -un; python3; echo python3=$?").stdout
        assert out == "/work\ndebian\napp\npython3=1\n"
        assert sbx.files.read("/usr/bin/python3") == BROKEN_PYTHON  # the image's, untouched
        assert sbx.files.read("/etc/debian_version") == Path("/etc/debian_version").read_text()
        _everything_an_agent_does(sbx, "/home/app")
    finally:
        sbx.kill()


def test_layers_with_whiteouts_and_hard_links(
    stack: Stack, registries: tuple[LocalRegistry, ...], tmp_path: Path
) -> None:
    base = busybox_tree(tmp_path / "base", "stat", "mkdir", "rm", "tty", "find")
    lower = tmp_path / "lower"
    (lower / "data/olddir").mkdir(parents=True)
    (lower / "data/olddir/inside.txt").write_text("gone with its directory\n")
    (lower / "data/keep.txt").write_text("kept\n")
    (lower / "data/gone.txt").write_text("whited out\n")
    (lower / "data/first").write_text("one inode, two names\n")
    (lower / "data/second").hardlink_to(lower / "data/first")
    (lower / "opq").mkdir()
    (lower / "opq/old.txt").write_text("hidden by the opaque marker\n")
    upper = tmp_path / "upper"
    (upper / "data").mkdir(parents=True)
    (upper / "data/.wh.gone.txt").touch()
    (upper / "data/.wh.olddir").touch()
    (upper / "opq").mkdir()
    (upper / "opq/.wh..wh..opq").touch()
    (upper / "opq/new.txt").write_text("above the opaque marker\n")
    (upper / "data/third").write_text("hard link in the top layer\n")
    (upper / "data/fourth").hardlink_to(upper / "data/third")
    ref = push(layout(tmp_path / "img", base, lower, upper), registries[0], "any/layers")
    sbx = _sandbox_from(ref)
    try:
        ls = sbx.commands.run("ls -A /data; echo --; ls -A /opq").stdout
        assert ls == "first\nfourth\nkeep.txt\nsecond\nthird\n--\nnew.txt\n"
        links = sbx.commands.run(
            "stat -c '%i %h' /data/first /data/second /data/third /data/fourth"
        ).stdout.split("\n")
        assert links[0] == links[1] and links[0].endswith(" 2"), links
        assert links[2] == links[3] and links[2].endswith(" 2") and links[0] != links[2], links
        assert sbx.files.read("/data/second") == "one inode, two names\n"
        _everything_an_agent_does(sbx, "/home/user")
    finally:
        sbx.kill()
