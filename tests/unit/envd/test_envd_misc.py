"""CLI parsing, path resolution and inotify decoding (pure)."""

from __future__ import annotations

import struct

import pytest

from envd import inotify, wire
from envd.__main__ import parse_args
from envd.users import User, resolve_path

U = User("user", 1000, 1000, "/home/user")


def test_cli_defaults_and_flags() -> None:
    o = parse_args([])
    assert (o.host, o.port, o.default_user, o.default_workdir) == ("0.0.0.0", 49983, "user", None)
    o = parse_args(
        ["--port=0", "--host", "127.0.0.1", "--default-user", "root", "--default-workdir", "/srv"]
    )
    assert (o.host, o.port, o.default_user, o.default_workdir) == ("127.0.0.1", 0, "root", "/srv")
    with pytest.raises(SystemExit):
        parse_args(["--bogus"])
    with pytest.raises(SystemExit):
        parse_args(["--port", "x"])
    with pytest.raises(SystemExit):
        parse_args(["--port"])


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("a.txt", "/home/user/a.txt"),
        ("d/../b", "/home/user/b"),
        ("~", "/home/user"),
        ("~/x", "/home/user/x"),
        ("/etc/hosts", "/etc/hosts"),
        ("/tmp//x/", "/tmp/x"),
        ("", "/home/user"),
    ],
)
def test_resolve_path(path: str, expected: str) -> None:
    assert resolve_path(path, U) == expected


def test_resolve_empty_path_uses_default_dir() -> None:
    assert resolve_path("", U, "/srv") == "/srv"


def _event(wd: int, mask: int, name: bytes) -> bytes:
    padded = name + b"\0" * (16 - len(name) % 16) if name else b""
    return struct.pack("iIII", wd, mask, 0, len(padded)) + padded


def test_parse_inotify_events() -> None:
    buf = _event(1, inotify.IN_CREATE, b"a.txt") + _event(2, inotify.IN_DELETE_SELF, b"")
    assert inotify.parse_events(buf) == [
        (1, inotify.IN_CREATE, 0, "a.txt"),
        (2, inotify.IN_DELETE_SELF, 0, ""),
    ]


@pytest.mark.parametrize(
    ("mask", "etypes"),
    [
        (inotify.IN_CREATE, [wire.EVENT_CREATE]),
        (inotify.IN_MOVED_TO | inotify.IN_ISDIR, [wire.EVENT_CREATE]),
        (inotify.IN_MODIFY, [wire.EVENT_WRITE]),
        (inotify.IN_DELETE, [wire.EVENT_REMOVE]),
        (inotify.IN_MOVED_FROM, [wire.EVENT_RENAME]),
        (inotify.IN_ATTRIB, [wire.EVENT_CHMOD]),
        (inotify.IN_IGNORED, []),
        # one event per kind, in the order of envd's watch.go
        (
            inotify.IN_DELETE | inotify.IN_MODIFY | inotify.IN_ATTRIB | inotify.IN_CREATE,
            [wire.EVENT_CREATE, wire.EVENT_CHMOD, wire.EVENT_WRITE, wire.EVENT_REMOVE],
        ),
    ],
)
def test_event_mapping_follows_fsnotify(mask: int, etypes: list[str]) -> None:
    assert inotify.event_types(mask) == etypes


def test_envd_imports_only_stdlib() -> None:
    """Guests have no third-party packages: every import of envd/ is stdlib or envd.*."""
    import ast
    import pathlib
    import sys

    root = pathlib.Path(__file__).resolve().parents[3] / "envd"
    for f in root.glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for n in names:
                top = n.split(".")[0]
                assert top == "envd" or top in sys.stdlib_module_names, f"{f.name}: {n}"


def test_envd_modules_import_on_the_oldest_supported_python() -> None:
    """envd supports Python 3.9: no module may evaluate 3.10+ syntax at import time (a
    runtime `A | B` type alias once broke every upload there). Skipped without a 3.9."""
    import glob
    import os
    import pathlib
    import subprocess

    # Real interpreters only: a pyenv shim on PATH may exist without the version behind it.
    candidates = [
        *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.9*/bin/python3.9"))),
        "/usr/bin/python3.9",
        "/usr/local/bin/python3.9",
    ]
    py = next((c for c in candidates if os.access(c, os.X_OK)), None)
    if py is None:
        pytest.skip("no Python 3.9 on this host")
    root = pathlib.Path(__file__).resolve().parents[3]
    modules = sorted(f.stem for f in (root / "envd").glob("*.py") if not f.stem.startswith("__"))
    code = "import importlib\n" + "".join(f"importlib.import_module('envd.{m}')\n" for m in modules)
    subprocess.run([py, "-c", code], cwd=root, check=True, capture_output=True, timeout=60)
