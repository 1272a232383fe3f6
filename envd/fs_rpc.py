"""filesystem.Filesystem: the Connect service behind `sandbox.files` (all but /files)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import TYPE_CHECKING, Any

from envd import auth, fsops, wire
from envd.asuser import run_as
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


def _denied(path: str, user: User, e: OSError) -> RpcError:
    return RpcError("permission_denied", f"{path}: {e.strerror} (as {user.name})")


async def _stat_entry(path: str, user: User) -> dict[str, Any]:
    try:
        entry: dict[str, Any] = await run_as(user, fsops.entry, path)
    except (FileNotFoundError, NotADirectoryError) as e:
        raise RpcError("not_found", f"file not found: {path}") from e
    except PermissionError as e:
        raise _denied(path, user, e) from e
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
        path, user = self._resolve(call, _path_arg(msg))
        return {"entry": await _stat_entry(path, user)}

    async def list_dir(self, call: Call, msg: dict[str, Any]) -> dict[str, Any]:
        path, user = self._resolve(call, _path_arg(msg))
        depth = int(msg.get("depth") or 1)
        try:
            entries = await run_as(user, fsops.list_dir, path, depth)
        except FileNotFoundError as e:
            raise RpcError("not_found", f"directory not found: {path}") from e
        except NotADirectoryError as e:
            raise RpcError("invalid_argument", f"path is not a directory: {path}") from e
        except PermissionError as e:
            raise _denied(path, user, e) from e
        return {"entries": entries}

    async def make_dir(self, call: Call, msg: dict[str, Any]) -> dict[str, Any]:
        path, user = self._resolve(call, _path_arg(msg))
        try:
            made = await run_as(user, fsops.make_dir, path)
        except (NotADirectoryError, FileExistsError) as e:
            raise RpcError("invalid_argument", f"a parent of {path} is not a directory") from e
        except PermissionError as e:
            raise _denied(path, user, e) from e
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
            entry = await run_as(user, fsops.move, src, dst)
        except FileNotFoundError as e:
            raise RpcError("not_found", f"cannot move {src}: {e.strerror}") from e
        except PermissionError as e:
            raise _denied(src, user, e) from e
        except OSError as e:
            raise RpcError("invalid_argument", f"cannot move {src} to {dst}: {e.strerror}") from e
        return {"entry": entry}

    async def remove(self, call: Call, msg: dict[str, Any]) -> dict[str, Any]:
        path, user = self._resolve(call, _path_arg(msg))
        try:
            await run_as(user, fsops.remove, path)
        except PermissionError as e:
            raise _denied(path, user, e) from e
        return {}

    # --- watching -----------------------------------------------------------------------

    async def _open_watcher(self, call: Call, msg: dict[str, Any], sink: Any) -> DirWatcher:
        from envd.inotify import DirWatcher, is_network_mount  # ctypes: only when watching

        path, user = self._resolve(call, _path_arg(msg))
        # the user must be able to list the directory; envd (root) then watches it
        try:
            is_dir = await run_as(user, fsops.check_watchable, path)
        except (FileNotFoundError, NotADirectoryError) as e:
            raise RpcError("not_found", f"path not found: {path}") from e
        except PermissionError as e:
            raise _denied(path, user, e) from e
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
