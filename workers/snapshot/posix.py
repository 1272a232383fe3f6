"""`PosixStore`: the snapshot store as a directory, e.g. on a filesystem shared by nodes.

Every write goes to a temp file in the destination directory and is renamed into place
after fsync, so a reader (or a node restarted mid-upload) sees a blob either whole or not
at all. Blocking file work runs in threads to keep the node's event loop responsive.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

from workers.snapshot import paths
from workers.snapshot.digest import IO_CHUNK, VerifyingWriter
from workers.snapshot.errors import BlobNotFound, ManifestNotFound, RetryableStoreError, StoreError
from workers.snapshot.store import BlobInfo, BlobSource

# errnos that describe a struggling shared filesystem rather than a logic error
_TRANSIENT = {errno.EIO, errno.EAGAIN, errno.ESTALE, errno.ETIMEDOUT, errno.EINTR, errno.EBUSY}


def _translate(e: OSError, what: str) -> StoreError:
    kind = RetryableStoreError if e.errno in _TRANSIENT else StoreError
    return kind(f"posix store: {what}: {e.strerror or e}")


class PosixStore:
    """A `SnapshotStore` rooted at a directory (created if missing)."""

    def __init__(self, root: Path, prefix: str = ""):
        self.root = root
        self.prefix = prefix
        root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.root / key

    async def has_blob(self, digest: str) -> bool:
        path = self._path(paths.blob_key(digest, self.prefix))
        try:
            st = await asyncio.to_thread(path.stat)
        except FileNotFoundError:
            return False
        return stat.S_ISREG(st.st_mode) and paths.complete_size(digest, st.st_size)

    async def put_blob(self, digest: str, source: BlobSource) -> None:
        dest = self._path(paths.blob_key(digest, self.prefix))
        try:
            await asyncio.to_thread(_atomic_write, dest, source)
        except OSError as e:
            raise _translate(e, f"put blob {digest}") from e

    async def get_blob_to(self, digest: str, dest: Path) -> int:
        src = self._path(paths.blob_key(digest, self.prefix))
        try:
            return await asyncio.to_thread(_verified_copy, src, dest, digest)
        except FileNotFoundError as e:
            if not src.exists():
                raise BlobNotFound(f"posix store: no blob {digest}") from e
            raise _translate(e, f"get blob {digest}") from e
        except OSError as e:
            raise _translate(e, f"get blob {digest}") from e

    async def delete_blob(self, digest: str) -> None:
        path = self._path(paths.blob_key(digest, self.prefix))
        await asyncio.to_thread(path.unlink, missing_ok=True)

    async def iter_blobs(self) -> AsyncIterator[BlobInfo]:
        root = self._path(paths.blobs_root(self.prefix))
        infos = await asyncio.to_thread(_scan_blobs, root, self.root, self.prefix)
        for info in infos:
            yield info

    async def put_manifest(self, snapshot_id: str, data: bytes) -> None:
        dest = self._path(paths.manifest_key(snapshot_id, self.prefix))
        try:
            await asyncio.to_thread(_atomic_write, dest, data)
        except OSError as e:
            raise _translate(e, f"put manifest {snapshot_id}") from e

    async def get_manifest(self, snapshot_id: str) -> bytes:
        path = self._path(paths.manifest_key(snapshot_id, self.prefix))
        try:
            return await asyncio.to_thread(path.read_bytes)
        except FileNotFoundError as e:
            raise ManifestNotFound(f"posix store: no manifest for snapshot {snapshot_id}") from e
        except OSError as e:
            raise _translate(e, f"get manifest {snapshot_id}") from e

    async def list_manifests(self) -> list[str]:
        root = self._path(paths.manifests_root(self.prefix))

        def scan() -> list[str]:
            if not root.is_dir():
                return []
            out = []
            for p in root.iterdir():
                key = p.relative_to(self.root).as_posix()
                sid = paths.snapshot_id_from_key(key, self.prefix)
                if sid is not None and p.is_file():
                    out.append(sid)
            return sorted(out)

        return await asyncio.to_thread(scan)

    async def delete_manifest(self, snapshot_id: str) -> None:
        path = self._path(paths.manifest_key(snapshot_id, self.prefix))
        await asyncio.to_thread(path.unlink, missing_ok=True)

    async def close(self) -> None:
        return None

    async def sweep_partial(self, older_than: timedelta = timedelta(hours=1)) -> int:
        """Delete temp files of writes a crash cut short (older than `older_than`, so a
        write in progress on another node is left alone); returns how many went."""
        cutoff = time.time() - older_than.total_seconds()

        def sweep() -> int:
            n = 0
            for p in self.root.rglob(".*.part"):
                with contextlib.suppress(FileNotFoundError):
                    if p.stat().st_mtime < cutoff:
                        p.unlink()
                        n += 1
            return n

        return await asyncio.to_thread(sweep)


def _atomic_write(dest: Path, source: BlobSource) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Temp names start with '.' so listings never mistake them for blobs or manifests.
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.part")
    try:
        with open(tmp, "wb") as fo:
            if isinstance(source, bytes):
                fo.write(source)
            else:
                with open(source, "rb") as fi:
                    while piece := fi.read(IO_CHUNK):
                        fo.write(piece)
            fo.flush()
            os.fsync(fo.fileno())
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _verified_copy(src: Path, dest: Path, digest: str) -> int:
    with open(src, "rb") as fi:
        w = VerifyingWriter(dest, digest)
        try:
            while piece := fi.read(IO_CHUNK):
                w.write(piece)
        except BaseException:
            w.abort()
            raise
        return w.commit()


def _scan_blobs(root: Path, base: Path, prefix: str) -> list[BlobInfo]:
    if not root.is_dir():
        return []
    out = []
    for fan in root.iterdir():
        if not fan.is_dir():
            continue
        for p in fan.iterdir():
            digest = paths.digest_from_key(p.relative_to(base).as_posix(), prefix)
            if digest is None:
                continue
            try:
                st = p.stat()
            except FileNotFoundError:  # deleted while we listed
                continue
            out.append(BlobInfo(digest, st.st_size, datetime.fromtimestamp(st.st_mtime, UTC)))
    return out
