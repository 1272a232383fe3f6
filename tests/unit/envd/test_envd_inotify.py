"""envd's directory watcher reports what E2B's envd (its fsnotify fork) reports: subtree
watches' own delete/move events dropped, a moved root ending the watch, a directory new to a
recursive watch announced entry by entry.

Decisions are driven with synthetic inotify events; the walk of a new tree with a real
inotify instance on a temporary directory (read synchronously: no loop needs to run).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from envd import inotify, wire
from envd.inotify import DirWatcher

Seen = list[tuple[str, str]]


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _synthetic(loop: asyncio.AbstractEventLoop, recursive: bool = True) -> tuple[DirWatcher, Seen]:
    """A watcher of /w with /w/sub watched too (wds 1 and 2), fed events by hand."""
    seen: Seen = []
    w = DirWatcher(loop, "/w", recursive, lambda t, rel, _p: seen.append((t, rel)))
    w.root_wd = 1
    w.paths = {1: "/w", 2: "/w/sub"}
    w.wds = {"/w": 1, "/w/sub": 2}
    return w, seen


def test_a_subdirectorys_removal_is_reported_once(loop: asyncio.AbstractEventLoop) -> None:
    w, seen = _synthetic(loop)
    w.handle(2, inotify.IN_DELETE, 0, "f.txt")
    w.handle(1, inotify.IN_DELETE | inotify.IN_ISDIR, 0, "sub")
    w.handle(2, inotify.IN_DELETE_SELF, 0, "")  # fsnotify: the parent reported it
    w.handle(2, inotify.IN_IGNORED, 0, "")
    assert seen == [(wire.EVENT_REMOVE, "sub/f.txt"), (wire.EVENT_REMOVE, "sub")]
    assert w.paths == {1: "/w"} and w.wds == {"/w": 1}
    w.handle(1, inotify.IN_DELETE_SELF, 0, "")  # the root: nobody else reports it
    assert seen[-1] == (wire.EVENT_REMOVE, ".")


def test_a_subdirectorys_move_is_reported_by_its_parent(
    loop: asyncio.AbstractEventLoop,
) -> None:
    w, seen = _synthetic(loop)
    w.handle(1, inotify.IN_MOVED_FROM | inotify.IN_ISDIR, 7, "sub")
    w.handle(2, inotify.IN_MOVE_SELF, 0, "")
    assert seen == [(wire.EVENT_RENAME, "sub")]


def test_a_moved_root_ends_the_watch(loop: asyncio.AbstractEventLoop) -> None:
    for recursive in (True, False):
        w, seen = _synthetic(loop, recursive)
        w.handle(1, inotify.IN_MOVE_SELF, 0, "")
        assert seen == [(wire.EVENT_RENAME, ".")]
        w.handle(2, inotify.IN_CREATE, 0, "late.txt")  # read in the same buffer: dropped
        assert seen == [(wire.EVENT_RENAME, ".")]


@pytest.fixture
def watched(
    tmp_path: Path, loop: asyncio.AbstractEventLoop
) -> Iterator[tuple[Path, DirWatcher, Seen]]:
    root = tmp_path / "w"
    (root / "sub").mkdir(parents=True)
    seen: Seen = []
    w = DirWatcher(loop, str(root), True, lambda t, rel, _p: seen.append((t, rel)))
    w.start()
    yield root, w, seen
    w.close()


def _tree(top: Path) -> None:
    (top / "b" / "c").mkdir(parents=True)
    (top / "a.txt").write_text("a")
    (top / "b" / "c" / "d.txt").write_text("d")
    os.symlink("/", top / "link")


def test_a_tree_moved_in_is_announced_entry_by_entry(
    tmp_path: Path, watched: tuple[Path, DirWatcher, Seen]
) -> None:
    root, w, seen = watched
    outside = tmp_path / "tree"
    _tree(outside)
    outside.rename(root / "sub" / "tree")
    w._on_readable()
    assert seen == [
        (wire.EVENT_CREATE, "sub/tree"),
        (wire.EVENT_CREATE, "sub/tree/a.txt"),
        (wire.EVENT_CREATE, "sub/tree/b"),
        (wire.EVENT_CREATE, "sub/tree/b/c"),
        (wire.EVENT_CREATE, "sub/tree/b/c/d.txt"),
        (wire.EVENT_CREATE, "sub/tree/link"),  # a link is announced, not followed
    ]
    seen.clear()
    (root / "sub" / "tree" / "b" / "c" / "e.txt").touch()  # its directories are watched
    w._on_readable()
    assert seen == [(wire.EVENT_CREATE, "sub/tree/b/c/e.txt")]


def test_a_rename_inside_the_tree_announces_nothing_more(
    watched: tuple[Path, DirWatcher, Seen],
) -> None:
    root, w, seen = watched
    _tree(root / "sub")
    w._on_readable()
    seen.clear()
    (root / "sub" / "b").rename(root / "moved")
    w._on_readable()
    assert seen == [(wire.EVENT_RENAME, "sub/b"), (wire.EVENT_CREATE, "moved")]
    seen.clear()
    (root / "moved" / "c" / "new.txt").write_text("x")  # found under its new path
    w._on_readable()
    assert seen == [
        (wire.EVENT_CREATE, "moved/c/new.txt"),
        (wire.EVENT_WRITE, "moved/c/new.txt"),
    ]
