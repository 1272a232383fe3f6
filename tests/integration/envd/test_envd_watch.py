"""Directory watching: sync `watch_dir` (polled watcher RPCs) and async (WatchDir stream)."""

from __future__ import annotations

import asyncio
import os

import pytest
from e2b import AsyncSandbox, FileNotFoundException, Sandbox
from e2b.sandbox.filesystem.watch_handle import FilesystemEvent, FilesystemEventType
from e2b.sandbox_sync.filesystem.watch_handle import WatchHandle

from tests.support import eventually, eventually_sync

pytestmark = pytest.mark.timeout(30)


def test_sync_watcher_sees_create_write_remove(sandbox: Sandbox, workdir: str) -> None:
    w = sandbox.files.watch_dir(workdir)
    seen: list[tuple[str, FilesystemEventType]] = []

    def has(name: str, kind: FilesystemEventType) -> bool:
        seen.extend((e.name, e.type) for e in w.get_new_events())
        return (name, kind) in seen

    sandbox.files.write(f"{workdir}/w.txt", "x")
    eventually_sync(lambda: has("w.txt", FilesystemEventType.CREATE))
    eventually_sync(lambda: has("w.txt", FilesystemEventType.WRITE))
    sandbox.commands.run(f"echo more >> {workdir}/w.txt; chmod 600 {workdir}/w.txt")
    eventually_sync(lambda: has("w.txt", FilesystemEventType.CHMOD))
    sandbox.files.rename(f"{workdir}/w.txt", f"{workdir}/v.txt")
    eventually_sync(lambda: has("w.txt", FilesystemEventType.RENAME))
    sandbox.files.remove(f"{workdir}/v.txt")
    eventually_sync(lambda: has("v.txt", FilesystemEventType.REMOVE))
    w.stop()


def test_sync_watcher_recursive_with_entries(sandbox: Sandbox, workdir: str) -> None:
    sandbox.files.make_dir(f"{workdir}/sub")  # the user's, as all envd makes for them
    w = sandbox.files.watch_dir(workdir, recursive=True, include_entry=True)
    sandbox.files.write(f"{workdir}/sub/deep.txt", "abc")
    events: list[FilesystemEvent] = []

    def created() -> bool:
        events.extend(w.get_new_events())
        return any(
            e.name == "sub/deep.txt" and e.type == FilesystemEventType.CREATE for e in events
        )

    eventually_sync(created)
    entry = next(e.entry for e in events if e.name == "sub/deep.txt" and e.entry)
    assert entry is not None and entry.path == f"{workdir}/sub/deep.txt"

    # a directory created after the watch started is watched too
    def saw(name: str) -> bool:
        events.extend(w.get_new_events())
        return any(e.name == name for e in events)

    sandbox.files.make_dir(f"{workdir}/later")
    eventually_sync(lambda: saw("later"))
    sandbox.files.write(f"{workdir}/later/x.txt", "x")
    eventually_sync(lambda: saw("later/x.txt"))
    w.stop()


CREATE, CHMOD, WRITE = (
    FilesystemEventType.CREATE,
    FilesystemEventType.CHMOD,
    FilesystemEventType.WRITE,
)
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="envd gives files to the user (the CHMOD) only as root"
)


def _settled(w: WatchHandle, at_least: int) -> list[tuple[str, FilesystemEventType]]:
    """Every event of the last operation: polled until `at_least` came, then once more
    (E2B's tests poll once, right after the write: these events are all there by then)."""
    seen: list[tuple[str, FilesystemEventType]] = []

    def enough() -> bool:
        seen.extend((e.name, e.type) for e in w.get_new_events())
        return len(seen) >= at_least

    eventually_sync(enough)
    seen.extend((e.name, e.type) for e in w.get_new_events())
    return seen


@needs_root
def test_a_new_file_is_create_chmod_write(sandbox: Sandbox, workdir: str) -> None:
    """E2B's test_watch_iterated: a write of a new file is 3 events, as E2B's envd reports
    them (open O_CREAT, chown to the user, the data): CREATE, CHMOD, WRITE. Overwritten,
    the file is chowned before it is truncated: CHMOD, then WRITEs."""
    w = sandbox.files.watch_dir(workdir)
    sandbox.files.write(f"{workdir}/f.txt", "This file will be watched.")
    assert _settled(w, 3) == [("f.txt", CREATE), ("f.txt", CHMOD), ("f.txt", WRITE)]
    sandbox.files.write(f"{workdir}/f.txt", "This file has been modified.")
    events = _settled(w, 2)
    assert events[:2] == [("f.txt", CHMOD), ("f.txt", WRITE)], events
    assert set(events[2:]) <= {("f.txt", WRITE)}, events  # the truncation's may stand apart
    w.stop()


@needs_root
def test_a_new_file_in_a_watched_subdirectory(sandbox: Sandbox, workdir: str) -> None:
    """E2B's test_watch_recursive_directory_changes: 3 events, the first the CREATE."""
    sandbox.files.make_dir(f"{workdir}/nested")
    w = sandbox.files.watch_dir(workdir, recursive=True)
    sandbox.files.write(f"{workdir}/nested/f.txt", "content")
    name = "nested/f.txt"
    assert _settled(w, 3) == [(name, CREATE), (name, CHMOD), (name, WRITE)]
    w.stop()


def test_watch_missing_dir(sandbox: Sandbox, workdir: str) -> None:
    with pytest.raises(FileNotFoundException):
        sandbox.files.watch_dir(f"{workdir}/missing")


async def test_async_watch_dir_stream(async_sandbox: AsyncSandbox, workdir: str) -> None:
    events: list[FilesystemEvent] = []
    handle = await async_sandbox.files.watch_dir(workdir, on_event=events.append, recursive=True)
    try:
        await async_sandbox.files.write(f"{workdir}/a.txt", "1")
        await async_sandbox.files.remove(f"{workdir}/a.txt")

        async def saw_all() -> bool:
            kinds = {(e.name, e.type) for e in events}
            return {
                ("a.txt", FilesystemEventType.CREATE),
                ("a.txt", FilesystemEventType.WRITE),
                ("a.txt", FilesystemEventType.REMOVE),
            } <= kinds

        await eventually(saw_all)
    finally:
        await handle.stop()  # type: ignore[no-untyped-call]
    await asyncio.sleep(0)
