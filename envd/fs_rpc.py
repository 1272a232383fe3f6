"""filesystem.Filesystem: the Connect service behind `sandbox.files` (all but /files).

Every call works with envd's rights and gives what it creates to the requesting user, as
E2B's envd does (`envd.fsops`); listings, directory removals and moves across filesystems
run in a forked child (`envd.offload`) so a large tree does not stall the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
from collections import deque
from typing import TYPE_CHECKING, Any

from envd import auth, fsops, offload, wire
from envd.connect import Call, RpcError, Send, encode, next_item
from envd.state import State
from envd.users import User, resolve_path

if TYPE_CHECKING:
    from envd.inotify import DirWatcher

MAX_WATCHER_EVENTS = 10_000  # per polled watcher; older events are dropped beyond this
KEEPALIVE = b'{"keepalive":{}}'


def _path_arg(msg: dict[str, Any], name: str = "path") -> str:
    value = msg.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise RpcError("invalid_argument", f"{name} must be a string")
    return value


def _denied(path: str, e: OSError) -> RpcError:
    """What root is refused too (an immutable file, a FUSE mount without allow_other)."""
    return RpcError("permission_denied", f"{path}: {e.strerror}")


def _stat_entry(path: str) -> dict[str, Any]:
    try:
        return fsops.entry(path)
    except (FileNotFoundError, NotADirectoryError) as e:
        raise RpcError("not_found", f"file not found: {path}") from e
    except PermissionError as e:
        raise _denied(path, e) from e


async def _move(src: str, dst: str, user: User) -> dict[str, Any]:
    try:
        return fsops.move(src, dst, user)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
    entry: dict[str, Any] = await offload.run(fsops.move_across, src, dst)
    return entry


class _PolledWatcher:
    """A CreateWatcher watcher: events buffer here until GetWatcherEvents collects them."""

    def __init__(self, watcher: DirWatcher) -> None:
        self.watcher = watcher
        self.events: deque[dict[str, Any]] = deque(maxlen=MAX_WATCHER_EVENTS)


class FilesystemService:
    """Handlers of filesystem.Filesystem."""

    def __init__(self, state: State, loop: asyncio.AbstractEventLoop) -> None:
        self.state = state
        self.loop = loop
        self.watchers: dict[str, _PolledWatcher] = {}

    def _resolve(self, call: Call, path: str) -> tuple[str, User]:
        user = auth.rpc_user(self.state, call.headers)
        return resolve_path(path, user), user

    # --- unary --------------------------------------------------------------------------

    async def stat(self, call: Call, msg: dict[str, Any]) -> dict[str, Any]:
        path, _ = self._resolve(call, _path_arg(msg))
        return {"entry": _stat_entry(path)}

    async def list_dir(self, call: Call, msg: dict[str, Any]) -> dict[str, Any]:
        path, _ = self._resolve(call, _path_arg(msg))
        depth = int(msg.get("depth") or 1)
        try:
            entries = await offload.run(fsops.list_dir, path, depth)
        except FileNotFoundError as e:
            raise RpcError("not_found", f"directory not found: {path}") from e
        except NotADirectoryError as e:
            raise RpcError("invalid_argument", f"path is not a directory: {path}") from e
        except PermissionError as e:
            raise _denied(path, e) from e
        return {"entries": entries}

    async def make_dir(self, call: Call, msg: dict[str, Any]) -> dict[str, Any]:
        path, user = self._resolve(call, _path_arg(msg))
        try:
            made = fsops.make_dir(path, user)
        except (NotADirectoryError, FileExistsError) as e:
            raise RpcError("invalid_argument", f"a parent of {path} is not a directory") from e
        except PermissionError as e:
            raise _denied(path, e) from e
        if made.get("exists") == "dir":
            raise RpcError("already_exists", f"directory already exists: {path}")
        if made.get("exists"):
            raise RpcError(
                "invalid_argument", f"path already exists and is not a directory: {path}"
            )
        return {"entry": made["entry"]}

    async def move(self, call: Call, msg: dict[str, Any]) -> dict[str, Any]:
        src, user = self._resolve(call, _path_arg(msg, "source"))
        dst, _ = self._resolve(call, _path_arg(msg, "destination"))
        try:
            entry = await _move(src, dst, user)
        except FileNotFoundError as e:
            raise RpcError("not_found", f"cannot move {src}: {e.strerror}") from e
        except PermissionError as e:
            raise _denied(src, e) from e
        except OSError as e:
            raise RpcError("invalid_argument", f"cannot move {src} to {dst}: {e.strerror}") from e
        return {"entry": entry}

    async def remove(self, call: Call, msg: dict[str, Any]) -> dict[str, Any]:
        path, _ = self._resolve(call, _path_arg(msg))
        try:
            if not fsops.remove(path):  # a directory: its tree, in a child
                await offload.run(fsops.remove_tree, path)
        except PermissionError as e:
            raise _denied(path, e) from e
        return {}

    # --- watching -----------------------------------------------------------------------

    async def _open_watcher(self, call: Call, msg: dict[str, Any], sink: Any) -> DirWatcher:
        from envd.inotify import DirWatcher, is_network_mount  # ctypes: only when watching

        path, _ = self._resolve(call, _path_arg(msg))
        try:
            is_dir = fsops.is_dir(path)
        except (FileNotFoundError, NotADirectoryError) as e:
            raise RpcError("not_found", f"path not found: {path}") from e
        except PermissionError as e:
            raise _denied(path, e) from e
        if not is_dir:
            raise RpcError("invalid_argument", f"path is not a directory: {path}")
        allow_net = bool(wire.field(msg, "allowNetworkMounts", "allow_network_mounts"))
        if not allow_net and is_network_mount(path):
            raise RpcError(
                "failed_precondition",
                f"{path} is on a network filesystem; set allow_network_mounts to watch it",
            )
        include = bool(wire.field(msg, "includeEntry", "include_entry"))

        def on_event(etype: str, rel: str, abspath: str) -> None:
            event: dict[str, Any] = {"name": rel, "type": etype}
            if include and etype not in (wire.EVENT_REMOVE, wire.EVENT_RENAME):
                with contextlib.suppress(OSError):
                    event["entry"] = wire.entry_info(abspath)
            sink(event)

        watcher = DirWatcher(self.loop, path, bool(msg.get("recursive")), on_event)
        try:
            watcher.start()
        except OSError as e:
            raise RpcError("internal", f"cannot watch {path}: {e.strerror}") from e
        return watcher

    async def watch_dir(self, call: Call, msg: dict[str, Any], send: Send) -> None:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        watcher = await self._open_watcher(call, msg, queue.put_nowait)
        try:
            await send(b'{"start":{}}')
            while True:
                try:
                    event = await next_item(queue, call.keepalive_s)
                except asyncio.TimeoutError:  # noqa: UP041 - not an alias before 3.11
                    await send(KEEPALIVE)
                    continue
                batch = [encode({"filesystem": event})]
                while not queue.empty():
                    batch.append(encode({"filesystem": queue.get_nowait()}))
                await send(*batch)
        finally:
            watcher.close()

    async def create_watcher(self, call: Call, msg: dict[str, Any]) -> dict[str, Any]:
        events: deque[dict[str, Any]] = deque(maxlen=MAX_WATCHER_EVENTS)
        watcher = await self._open_watcher(call, msg, events.append)
        polled = _PolledWatcher(watcher)
        polled.events = events
        import uuid

        watcher_id = str(uuid.uuid4())
        self.watchers[watcher_id] = polled
        return {"watcherId": watcher_id}

    def _watcher(self, msg: dict[str, Any]) -> tuple[str, _PolledWatcher]:
        wid = wire.field(msg, "watcherId", "watcher_id")
        polled = self.watchers.get(wid) if isinstance(wid, str) else None
        if polled is None:
            raise RpcError("not_found", f"watcher {wid!r} not found")
        return wid, polled

    async def get_watcher_events(self, call: Call, msg: dict[str, Any]) -> dict[str, Any]:
        _, polled = self._watcher(msg)
        events = list(polled.events)
        polled.events.clear()
        return {"events": events} if events else {}

    async def remove_watcher(self, call: Call, msg: dict[str, Any]) -> dict[str, Any]:
        wid, polled = self._watcher(msg)
        polled.watcher.close()
        del self.watchers[wid]
        return {}

    def close_all(self) -> None:
        for polled in self.watchers.values():
            polled.watcher.close()
        self.watchers.clear()
