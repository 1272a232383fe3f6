"""The volume content API's operations on one volume image (E2B's `/volumecontent/{id}/…`):
stat, list, read, write, make a directory, remove, change owner and mode — each a debugfs
script (`debugfs.py`). The caller holds the image (the volume's node-local lock, and for a
change the volume itself, attached to the write), so nothing else touches it meanwhile.

Entries have E2B's `VolumeEntryStat` shape: name, type, path, size, mode (the permission
bits), uid, gid, atime, mtime, ctime, and a symlink's target. A new file or directory
belongs to its parent directory's owner unless the request names one (a volume's root is
its first sandbox's default user's: what a sandbox writes and what the API writes then
share an owner), with mode 0644 / 0755 unless given.
"""

from __future__ import annotations

import posixpath
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workers.node.volumes import debugfs as dbg

__all__ = ["ContentError", "VolumeContent", "entry"]

_TYPE_BITS = {"file": 0o100000, "directory": 0o040000, "symlink": 0o120000}
#: How deep a listing may recurse (E2B's `depth`), and how many entries it may return.
MAX_DEPTH = 16
MAX_ENTRIES = 100_000


class ContentError(Exception):
    """A content request that cannot be done: `status` is the HTTP status it means."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def entry(path: str, inode: dbg.Inode) -> dict[str, Any]:
    """E2B's `VolumeEntryStat` of `inode` at `path`."""
    out: dict[str, Any] = {
        "name": posixpath.basename(path) or "/",
        "type": inode.type,
        "path": path,
        "size": inode.size,
        "mode": inode.mode & 0o7777,
        "uid": inode.uid,
        "gid": inode.gid,
        "atime": inode.atime.isoformat(),
        "mtime": inode.mtime.isoformat(),
        "ctime": inode.ctime.isoformat(),
    }
    if inode.type == "symlink":
        out["target"] = inode.target or ""
    return out


@dataclass(frozen=True)
class Owner:
    uid: int | None = None
    gid: int | None = None
    mode: int | None = None


class VolumeContent:
    """Operations on the ext4 in `image`; `scratch` holds temporary files (a read's copy)."""

    def __init__(self, image: Path, scratch: Path) -> None:
        self.image = image
        self.scratch = scratch

    async def _stat(self, path: str) -> dbg.Inode:
        try:
            (out,) = await dbg.run(self.image, [f"stat {dbg.quote(path)}"])
        except dbg.NotFoundError as e:
            raise ContentError(404, f"path {path} not found") from e
        inode = dbg.parse_stat(out)
        if inode.type == "symlink" and inode.target is None:  # a long target: in a block
            dumped = await self._dump(path)
            try:
                inode = dbg.Inode(**{**inode.__dict__, "target": dumped.read_text()})
            finally:
                dumped.unlink(missing_ok=True)
        return inode

    async def exists(self, path: str) -> dbg.Inode | None:
        try:
            return await self._stat(path)
        except ContentError:
            return None

    async def stat(self, path: str) -> dict[str, Any]:
        path = _checked(path)
        return entry(path, await self._stat(path))

    async def list_dir(self, path: str, depth: int = 1) -> list[dict[str, Any]]:
        """The entries under directory `path`, `depth` levels deep (1: its children)."""
        path = _checked(path)
        if not 1 <= depth <= MAX_DEPTH:
            raise ContentError(400, f"depth must be between 1 and {MAX_DEPTH}")
        top = await self._stat(path)
        if top.type != "directory":
            raise ContentError(400, f"{path} is not a directory")
        out: list[dict[str, Any]] = []
        level = [path]
        for _ in range(depth):
            children = await self._children(level)
            if not children:
                break
            stats = await dbg.run(self.image, [f"stat {dbg.quote(c)}" for c, _ in children])
            nxt = []
            for (child, _), text in zip(children, stats, strict=True):
                inode = dbg.parse_stat(text)
                out.append(entry(child, inode))
                if inode.type == "directory":
                    nxt.append(child)
            if len(out) > MAX_ENTRIES:
                raise ContentError(400, f"more than {MAX_ENTRIES} entries: list less deep")
            level = nxt
        return out

    async def _children(self, dirs: list[str]) -> list[tuple[str, dbg.Listed]]:
        if not dirs:
            return []
        listings = await dbg.run(self.image, [f"ls -p {dbg.quote(d)}" for d in dirs])
        return [
            (posixpath.join(d, item.name), item)
            for d, text in zip(dirs, listings, strict=True)
            for item in dbg.parse_ls(text)
        ]

    async def _dump(self, path: str) -> Path:
        self.scratch.mkdir(parents=True, exist_ok=True)
        dest = self.scratch / f"read-{uuid.uuid4().hex}"
        await dbg.run(self.image, [f"dump {dbg.quote(path)} {dbg.quote(str(dest))}"])
        if not dest.exists():
            raise ContentError(500, f"{path} could not be read")
        return dest

    async def read(self, path: str) -> Path:
        """A copy of file `path` in the scratch directory (the caller streams and deletes)."""
        path = _checked(path)
        inode = await self._stat(path)
        if inode.type == "directory":
            raise ContentError(400, f"{path} is a directory")
        return await self._dump(path)

    async def write(self, path: str, source: Path, owner: Owner, *, force: bool) -> dict[str, Any]:
        """File `path` with `source`'s bytes (a file there is replaced; its parent must
        exist unless `force`, which makes the missing directories)."""
        path = _checked(path)
        if path == "/":
            raise ContentError(400, "cannot write the root directory")
        current = await self.exists(path)
        if current is not None and current.type == "directory":
            raise ContentError(409, f"{path} is a directory")
        parent = await self._parent(path, force=force, owner=owner)
        uid, gid = _ids(owner, parent)
        mode = _TYPE_BITS["file"] | ((owner.mode if owner.mode is not None else 0o644) & 0o7777)
        script = [f"rm {dbg.quote(path)}"] if current is not None else []
        script += [
            f"write {dbg.quote(str(source))} {dbg.quote(path)}",
            *_attrs(path, mode, uid, gid),
        ]
        await dbg.run(self.image, script, write=True)
        return await self.stat(path)

    async def make_dir(self, path: str, owner: Owner, *, force: bool) -> dict[str, Any]:
        path = _checked(path)
        current = await self.exists(path)
        if current is not None:
            if current.type == "directory" and force:
                return entry(path, current)
            raise ContentError(409, f"{path} already exists")
        await self._parent(path, force=force, owner=owner)
        await self._mkdir(path, owner, await self._stat(posixpath.dirname(path)))
        return await self.stat(path)

    async def _mkdir(self, path: str, owner: Owner, parent: dbg.Inode) -> None:
        uid, gid = _ids(owner, parent)
        mode = _TYPE_BITS["directory"] | (
            (owner.mode if owner.mode is not None else 0o755) & 0o7777
        )
        await dbg.run(
            self.image, [f"mkdir {dbg.quote(path)}", *_attrs(path, mode, uid, gid)], write=True
        )

    async def _parent(self, path: str, *, force: bool, owner: Owner) -> dbg.Inode:
        """The parent directory of `path`, made (with its missing ancestors) if `force`."""
        parent = posixpath.dirname(path)
        found = await self.exists(parent)
        if found is not None:
            if found.type != "directory":
                raise ContentError(409, f"{parent} is not a directory")
            return found
        if not force:
            raise ContentError(404, f"directory {parent} not found (force creates it)")
        above = await self._parent(parent, force=True, owner=owner)
        dir_owner = Owner(owner.uid, owner.gid, None)  # the mode asked for is the leaf's
        await self._mkdir(parent, dir_owner, above)
        return await self._stat(parent)

    async def remove(self, path: str) -> None:
        """A file, symlink or (with everything in it) directory."""
        path = _checked(path)
        if path == "/":
            raise ContentError(400, "cannot remove the volume's root")
        inode = await self._stat(path)
        if inode.type != "directory":
            await dbg.run(self.image, [f"rm {dbg.quote(path)}"], write=True)
            return
        files, dirs = [], [path]
        level = [path]
        while level:
            children = await self._children(level)
            level = []
            for child, listed in children:
                if (listed.mode & 0o170000) == _TYPE_BITS["directory"]:
                    dirs.append(child)
                    level.append(child)
                else:
                    files.append(child)
        script = [f"rm {dbg.quote(f)}" for f in files]
        script += [f"rmdir {dbg.quote(d)}" for d in reversed(dirs)]  # deepest first
        await dbg.run(self.image, script, write=True)

    async def set_attrs(self, path: str, owner: Owner) -> dict[str, Any]:
        path = _checked(path)
        inode = await self._stat(path)
        type_bits = _TYPE_BITS.get(inode.type, 0)
        mode = type_bits | (owner.mode & 0o7777 if owner.mode is not None else inode.mode)
        uid = owner.uid if owner.uid is not None else inode.uid
        gid = owner.gid if owner.gid is not None else inode.gid
        await dbg.run(self.image, _attrs(path, mode, uid, gid), write=True)
        return await self.stat(path)


def _checked(path: str) -> str:
    try:
        return dbg.check_path(path)
    except ValueError as e:
        raise ContentError(400, str(e)) from e


def _ids(owner: Owner, parent: dbg.Inode) -> tuple[int, int]:
    uid = owner.uid if owner.uid is not None else parent.uid
    gid = owner.gid if owner.gid is not None else parent.gid
    return uid, gid


def _attrs(path: str, mode: int, uid: int, gid: int) -> list[str]:
    q = dbg.quote(path)
    return [f"sif {q} mode 0{mode:o}", f"sif {q} uid {uid}", f"sif {q} gid {gid}"]
