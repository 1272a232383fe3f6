"""Protobuf-JSON shapes of envd's messages (process.proto, filesystem.proto), in one place.

We emit what Go's `protojson` emits, because that is what the real envd sends and what every
E2B client has been tested against: lowerCamelCase names, zero values omitted, enums by name,
int64 as JSON strings, bytes as padded standard base64, RFC 3339 timestamps. Incoming
messages are decoded leniently (camelCase or snake_case, enum names or numbers).
"""

from __future__ import annotations

import binascii
import os
import stat
import time
from typing import Any

# --- scalars -------------------------------------------------------------------------------


def b64(data: bytes) -> str:
    """protojson `bytes`: standard base64 with padding."""
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def unb64(value: object) -> bytes:
    """Decode a protojson `bytes` field; accepts standard or URL-safe, padded or not."""
    if not isinstance(value, str) or not value:
        return b""
    s = value.replace("-", "+").replace("_", "/")
    s += "=" * (-len(s) % 4)
    try:
        return binascii.a2b_base64(s)
    except binascii.Error as e:
        raise ValueError(f"invalid base64: {e}") from e


def field(msg: dict[str, Any], camel: str, snake: str | None = None) -> Any:
    """Read a field by its JSON name, falling back to the proto (snake_case) name."""
    if camel in msg:
        return msg[camel]
    if snake is not None:
        return msg.get(snake)
    return None


def timestamp(sec: int, nanos: int = 0) -> str:
    """google.protobuf.Timestamp as Go protojson writes it: UTC, 0/3/6/9 fractional digits."""
    base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
    if nanos == 0:
        return base + "Z"
    if nanos % 1_000_000 == 0:
        return f"{base}.{nanos // 1_000_000:03d}Z"
    if nanos % 1_000 == 0:
        return f"{base}.{nanos // 1_000:06d}Z"
    return f"{base}.{nanos:09d}Z"


# --- filesystem.EntryInfo ----------------------------------------------------------------

FILE_TYPE_UNSPECIFIED = "FILE_TYPE_UNSPECIFIED"
FILE_TYPE_FILE = "FILE_TYPE_FILE"
FILE_TYPE_DIRECTORY = "FILE_TYPE_DIRECTORY"
FILE_TYPE_SYMLINK = "FILE_TYPE_SYMLINK"

EVENT_CREATE = "EVENT_TYPE_CREATE"
EVENT_WRITE = "EVENT_TYPE_WRITE"
EVENT_REMOVE = "EVENT_TYPE_REMOVE"
EVENT_RENAME = "EVENT_TYPE_RENAME"
EVENT_CHMOD = "EVENT_TYPE_CHMOD"

_RWX = "rwxrwxrwx"


def go_mode_string(st_mode: int) -> str:
    """Go's `fs.FileMode.String()` for a Unix st_mode, e.g. "-rw-r--r--", "drwxr-xr-x".

    Go's letters come first, in the fixed order of "dalTLDpSugct?" (a, l, T never occur for
    Unix files); '-' when there is none. A character device is "Dc", /tmp is "dtrwxrwxrwx".
    """
    letters = ""
    fmt = stat.S_IFMT(st_mode)
    if fmt == stat.S_IFDIR:
        letters += "d"
    if fmt == stat.S_IFLNK:
        letters += "L"
    if fmt in (stat.S_IFBLK, stat.S_IFCHR):
        letters += "D"
    if fmt == stat.S_IFIFO:
        letters += "p"
    if fmt == stat.S_IFSOCK:
        letters += "S"
    if st_mode & stat.S_ISUID:
        letters += "u"
    if st_mode & stat.S_ISGID:
        letters += "g"
    if fmt == stat.S_IFCHR:
        letters += "c"
    if st_mode & stat.S_ISVTX:
        letters += "t"
    perm = "".join(_RWX[i] if st_mode & (1 << (8 - i)) else "-" for i in range(9))
    return (letters or "-") + perm


def file_type(st_mode: int) -> str:
    """FileType enum name: regular files and directories; everything else is unspecified."""
    if stat.S_ISDIR(st_mode):
        return FILE_TYPE_DIRECTORY
    if stat.S_ISREG(st_mode):
        return FILE_TYPE_FILE
    if stat.S_ISLNK(st_mode):
        return FILE_TYPE_SYMLINK
    return FILE_TYPE_UNSPECIFIED


_names: dict[tuple[str, int], str] = {}


def _owner(uid: int) -> str:
    key = ("u", uid)
    if key not in _names:
        import pwd

        try:
            _names[key] = pwd.getpwuid(uid).pw_name
        except KeyError:
            _names[key] = str(uid)
    return _names[key]


def _group(gid: int) -> str:
    key = ("g", gid)
    if key not in _names:
        import grp

        try:
            _names[key] = grp.getgrgid(gid).gr_name
        except KeyError:
            _names[key] = str(gid)
    return _names[key]


METADATA_XATTR_PREFIX = "user.e2b."


def read_metadata(path: str) -> dict[str, str]:
    """User metadata stored as `user.e2b.*` xattrs (envd 0.6.2), prefix stripped."""
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return {}
    out: dict[str, str] = {}
    for name in names:
        if name.startswith(METADATA_XATTR_PREFIX):
            try:
                value = os.getxattr(path, name, follow_symlinks=False)
            except OSError:
                continue
            out[name[len(METADATA_XATTR_PREFIX) :]] = value.decode("utf-8", "replace")
    return out


def entry_info(path: str, st: os.stat_result | None = None) -> dict[str, Any]:
    """EntryInfo for `path` (absolute), from lstat: a symlink reports its target's type.

    Raises FileNotFoundError like os.lstat when the path does not exist.
    """
    if st is None:
        st = os.lstat(path)
    entry: dict[str, Any] = {
        "name": os.path.basename(path) or path,
        "path": path,
    }
    ftype = file_type(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        entry["isSymlink"] = True
        try:
            target = os.readlink(path)
            entry["symlinkTarget"] = os.path.normpath(os.path.join(os.path.dirname(path), target))
        except OSError:
            pass
        try:
            ftype = file_type(os.stat(path).st_mode)
        except OSError:  # dangling link: still list it, as a symlink
            ftype = FILE_TYPE_SYMLINK
    if ftype != FILE_TYPE_UNSPECIFIED:
        entry["type"] = ftype
    if st.st_size:
        entry["size"] = str(st.st_size)
    perm = stat.S_IMODE(st.st_mode) & 0o777
    if perm:
        entry["mode"] = perm
    entry["permissions"] = go_mode_string(st.st_mode)
    entry["owner"] = _owner(st.st_uid)
    entry["group"] = _group(st.st_gid)
    entry["modifiedTime"] = timestamp(*divmod(st.st_mtime_ns, 1_000_000_000))
    meta = read_metadata(path)
    if meta:
        entry["metadata"] = meta
    return entry


# --- process.ProcessEvent ----------------------------------------------------------------

# Go's syscall signal descriptions (zerrors_linux), used by os.ProcessState.String().
_SIGNAL_NAMES = {
    1: "hangup",
    2: "interrupt",
    3: "quit",
    4: "illegal instruction",
    5: "trace/breakpoint trap",
    6: "aborted",
    7: "bus error",
    8: "floating point exception",
    9: "killed",
    10: "user defined signal 1",
    11: "segmentation fault",
    12: "user defined signal 2",
    13: "broken pipe",
    14: "alarm clock",
    15: "terminated",
    16: "stack fault",
    17: "child exited",
    18: "continued",
    19: "stopped (signal)",
    20: "stopped",
    21: "stopped (tty input)",
    22: "stopped (tty output)",
    23: "urgent I/O condition",
    24: "CPU time limit exceeded",
    25: "file size limit exceeded",
    26: "virtual timer expired",
    27: "profiling timer expired",
    28: "window changed",
    29: "I/O possible",
    30: "power failure",
    31: "bad system call",
}


def end_event(wait_status: int) -> dict[str, Any]:
    """ProcessEvent.EndEvent from a waitpid status, mirroring Go's os.ProcessState.

    exit 0 -> {"exited":true,"status":"exit status 0"}; exit 3 adds exitCode and error;
    SIGKILL -> {"exitCode":-1,"status":"signal: killed","error":"signal: killed"}.
    """
    if os.WIFEXITED(wait_status):
        code = os.WEXITSTATUS(wait_status)
        status = f"exit status {code}"
        if code == 0:
            return {"exited": True, "status": status}
        return {"exitCode": code, "exited": True, "status": status, "error": status}
    if os.WIFSIGNALED(wait_status):
        sig = os.WTERMSIG(wait_status)
        status = "signal: " + _SIGNAL_NAMES.get(sig, f"signal {sig}")
        if os.WCOREDUMP(wait_status):
            status += " (core dumped)"
        return {"exitCode": -1, "status": status, "error": status}
    return {"exitCode": -1, "status": f"unknown wait status {wait_status}"}


SIGNALS = {"SIGNAL_SIGKILL": 9, "SIGNAL_SIGTERM": 15, 9: 9, 15: 15}
