"""`GET /files` and `POST /files`: file download and upload, streamed both ways."""

from __future__ import annotations

import errno
import json
import os
import stat
from typing import TYPE_CHECKING, Any

from envd import auth, fsops, wire
from envd.httpserver import HttpError, Request
from envd.state import State
from envd.users import User, resolve_path

if TYPE_CHECKING:
    from envd.multipart import Event, PartStart

#: Files up to this size are read into memory and sent with the length read (see download)
READ_WHOLE = 1024 * 1024
GZIP_LEVEL = 1  # speed over ratio: the link is local, gzip is only there because it was asked
#: The form field E2B's envd writes; it skips every other part of a multipart upload.
FILE_FIELD = "file"
# Uploads take everything buffered at once: the connection buffer then empties (no compaction)
# and each os.write is as large as possible.
UPLOAD_READ = 4 * 1024 * 1024


def wants_gzip(accept_encoding: str) -> bool:
    """Compress only when gzip is the client's explicit choice (`read(gzip=True)` sends just
    "gzip"); httpx's default "gzip, deflate" gets identity, which is always acceptable and
    keeps plain downloads zero-copy."""
    codings = {}
    for item in accept_encoding.split(","):
        name, _, params = item.strip().partition(";")
        q = 1.0
        params = params.strip()
        if params.startswith("q="):
            try:
                q = float(params[2:])
            except ValueError:
                q = 0.0
        if name:
            codings[name.strip().lower()] = q
    return codings.get("gzip", 0.0) > 0 and set(codings) <= {"gzip", "identity"}


async def download(state: State, req: Request) -> None:
    auth.check_files_access(state, req, auth.SIGNING_READ)
    q = req.query
    user = auth.http_user(state, q.get("username"))
    raw = q.get("path", "")
    if not raw:
        raise HttpError(400, "path is required")
    path = resolve_path(raw, user, state.default_workdir)
    try:
        fd = fsops.open_read(path)  # with envd's rights, as E2B's envd (see envd.fsops)
    except (FileNotFoundError, NotADirectoryError) as e:
        raise HttpError(404, f"path '{path}' does not exist") from e
    except PermissionError as e:  # root refused too: an immutable file, a FUSE mount
        raise HttpError(403, f"permission denied: {path}") from e
    except OSError as e:
        raise HttpError(500, f"cannot open '{path}': {e.strerror}") from e
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):  # opening a directory read-only succeeds; reading it not
        os.close(fd)
        raise HttpError(400, f"path '{path}' is a directory")
    with open(fd, "rb") as f:  # noqa: ASYNC230 - wraps the descriptor just opened
        name = os.path.basename(path).replace('"', "%22")
        headers = [
            ("Content-Type", "application/octet-stream"),
            ("Content-Disposition", f'inline; filename="{name}"'),
        ]
        gzip = wants_gzip(req.headers.get("accept-encoding", ""))
        if not gzip and stat.S_ISREG(st.st_mode) and st.st_size > 0:
            if st.st_size <= READ_WHOLE:
                # one read, then the length of what was read: a small file that a process
                # keeps rewriting (a counter, a status file) is answered whole, as it is now
                await req.respond(200, f.read(READ_WHOLE), headers=headers)
            else:
                await req.respond_file(200, f, st.st_size, headers)
            return
        # gzip, or a file whose size says nothing (procfs, pipes, devices): stream it.
        comp = None
        extra = [headers[1]]
        if gzip:
            import zlib

            comp = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)
            extra.append(("Content-Encoding", "gzip"))
        out = await req.begin_chunked(200, "application/octet-stream", extra)
        while True:
            chunk = f.read(1024 * 1024)
            if not chunk:
                break
            await out.write(comp.compress(chunk) if comp else chunk)
        if comp:
            await out.write(comp.flush())
        await out.end()


def _metadata(req: Request) -> dict[str, str]:
    prefix = "x-metadata-"
    return {
        k[len(prefix) :]: v for k, v in req.headers.items() if k.startswith(prefix) and k != prefix
    }


class _Sink:
    """One file being written: opened with envd's rights and given to the user (parents
    created, theirs too: `fsops.create_file`), metadata set at close."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self.fd = fd

    @classmethod
    def open(cls, path: str, user: User) -> _Sink:
        """Refusals answered as E2B's envd answers them (upload.go processFile): a directory
        at `path` is the client's mistake (400); parents that cannot be made, or a file that
        cannot be opened or chowned, are the sandbox's (500), a full disk 507."""
        try:
            return cls(path, fsops.create_file(path, user))
        except IsADirectoryError as e:
            raise HttpError(400, f"path is a directory: {path}") from e
        except fsops.ParentError as e:
            raise HttpError(500, f"error ensuring directories: {_reason(e)}") from e
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise HttpError(507, f"not enough inodes available: {path}") from e
            raise HttpError(500, f"error opening file: {_reason(e)}") from e

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        try:
            while view:
                n = os.write(self.fd, view)
                view = view[n:]
        except OSError as e:
            self.close()
            raise _os_error(e, self.path) from e

    def finish(self, meta: dict[str, str]) -> None:
        """Metadata set on the open file, not on the path: the path may be another file by
        now (the user can replace it), the descriptor cannot."""
        try:
            _set_metadata(self.fd, self.path, meta)
        finally:
            self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _reason(e: OSError) -> str:
    return f"{e.strerror}: {e.filename}" if e.filename else str(e.strerror)


def _os_error(e: OSError, path: str) -> HttpError:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return HttpError(507, f"not enough disk space to write '{path}'")
    return HttpError(500, f"cannot write '{path}': {e.strerror}")


def _set_metadata(fd: int, path: str, meta: dict[str, str]) -> None:
    """The file's metadata becomes exactly `meta`: a write replaces the file, and what an
    earlier write set goes with it (E2B's: `write(f, "b")` after `write(f, "a",
    metadata=…)` leaves none)."""
    wanted = {wire.METADATA_XATTR_PREFIX + k.lower(): v for k, v in meta.items()}
    try:
        for name in os.listxattr(fd):
            if name.startswith(wire.METADATA_XATTR_PREFIX) and name not in wanted:
                os.removexattr(fd, name)
        for name, value in wanted.items():
            os.setxattr(fd, name, value.encode())
    except OSError as e:
        raise HttpError(500, f"cannot store metadata on '{path}': {e.strerror}") from e


def _result(path: str, meta: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {"path": path, "name": os.path.basename(path), "type": "file"}
    if meta:
        out["metadata"] = meta
    return out


async def upload(state: State, req: Request) -> None:
    auth.check_files_access(state, req, auth.SIGNING_WRITE)
    q = req.query
    user = auth.http_user(state, q.get("username"))
    meta = _metadata(req)
    query_path = q.get("path", "")
    ctype = req.headers.get("content-type", "")
    from envd.multipart import boundary_of  # only uploads need it

    boundary = boundary_of(ctype)
    if boundary is not None:
        parts = _PartWriter(state, user, meta, query_path)
        results = await parts.upload(req, boundary)
    else:
        results = [await _upload_raw(state, req, user, meta, query_path)]
    await req.respond(200, json.dumps(results).encode(), "application/json")


class _PartWriter:
    """A multipart upload: each `file` part written to its own file (`path`, if given,
    names every part's file; otherwise the part's filename does). Other parts (a form's
    fields, posted to an `upload_url` from a browser) are skipped, as E2B's envd does: they
    must not overwrite the file."""

    def __init__(self, state: State, user: User, meta: dict[str, str], query_path: str) -> None:
        self.state = state
        self.user = user
        self.meta = meta
        self.query_path = query_path
        self.sink: _Sink | None = None
        self.results: list[dict[str, Any]] = []

    async def upload(self, req: Request, boundary: bytes) -> list[dict[str, Any]]:
        from envd.multipart import MultipartError, MultipartParser

        parser = MultipartParser(boundary)
        try:
            while not parser.done:
                buf, start, end = await req.read_span(UPLOAD_READ)
                if start == end:
                    break
                # Part data arrives as views of the connection's buffer: written before the
                # next read, as they must be.
                self._take(parser.feed(buf, start, end))
        except MultipartError as e:
            raise HttpError(400, f"invalid multipart body: {e}") from e
        finally:
            if self.sink is not None:
                self.sink.close()
        return self.results  # no `file` part: `[]`, as E2B's envd answers

    def _take(self, events: list[Event]) -> None:
        """Synchronous: the parts' data are views of the connection's buffer, valid until
        the next read, which cannot come before this returns."""
        from envd.multipart import PartData, PartEnd, PartStart

        for ev in events:
            if isinstance(ev, PartStart):
                self.sink = self._open(ev) if ev.name == FILE_FIELD else None
            elif isinstance(ev, PartData) and self.sink is not None:
                self.sink.write(ev.data)
            elif isinstance(ev, PartEnd) and self.sink is not None:
                self.sink.finish(self.meta)
                self.results.append(_result(self.sink.path, self.meta))
                self.sink = None

    def _open(self, part: PartStart) -> _Sink:
        target = self.query_path or part.filename or ""
        if not target:
            raise HttpError(400, "part has no filename and no path was given")
        target = resolve_path(target, self.user, self.state.default_workdir)
        return _Sink.open(target, self.user)


async def _upload_raw(
    state: State, req: Request, user: User, meta: dict[str, str], query_path: str
) -> dict[str, Any]:
    """An `application/octet-stream` body (gzip-encoded if it says so): one file, at `path`."""
    if not query_path:
        raise HttpError(400, "path is required for application/octet-stream uploads")
    sink = _Sink.open(resolve_path(query_path, user, state.default_workdir), user)
    decomp = None
    if req.headers.get("content-encoding", "").strip().lower() == "gzip":
        import zlib

        decomp = zlib.decompressobj(47)  # gzip or zlib header, auto-detected
    try:
        while True:
            view = await req.read_view(UPLOAD_READ)
            if not view:
                break
            if decomp is not None:
                try:
                    sink.write(decomp.decompress(view))
                except Exception as e:
                    raise HttpError(400, f"invalid gzip body: {e}") from e
            else:
                sink.write(view)
        if decomp is not None:
            sink.write(decomp.flush())
        sink.finish(meta)
    finally:
        sink.close()
    return _result(sink.path, meta)
