"""e2fsprogs' `debugfs`, driven on a volume's image: the content API's file operations
without mounting anything.

Why not a loop mount: the image is an ext4 a guest wrote, i.e. untrusted input, and a
kernel mount of it on the host is the host kernel's ext4 parsing whatever a guest crafted.
debugfs reads and writes the same format in a user process, needs no privilege, and
changes only the one file. Its exit status is 0 whatever happens, so failures are read
from stderr (every line but its banner); its outputs used here are stable formats:
`ls -p` (`/inode/mode/uid/gid/name/size/`) and `stat`.

Pure parsing is separate from the one function that runs the tool, so the parsers are
unit-tested on recorded output.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

__all__ = [
    "DebugfsError",
    "Inode",
    "Listed",
    "NotFoundError",
    "check_path",
    "parse_ls",
    "parse_stat",
    "quote",
    "run",
    "split_sections",
]

DEBUGFS = "debugfs"
E2FSCK = "e2fsck"


class DebugfsError(Exception):
    """debugfs said something went wrong (the message is its own)."""


class NotFoundError(DebugfsError):
    """The path does not exist in the file system."""


@dataclass(frozen=True)
class Listed:
    """One line of `ls -p`."""

    inode: int
    mode: int
    uid: int
    gid: int
    name: str
    size: int


@dataclass(frozen=True)
class Inode:
    """What `stat` says of one inode."""

    type: str  # file | directory | symlink | unknown
    mode: int  # permission bits (and set-id, sticky)
    uid: int
    gid: int
    size: int
    atime: datetime
    mtime: datetime
    ctime: datetime
    target: str | None = None  # a fast symlink's destination


def check_path(path: str) -> str:
    """An absolute, normalised path debugfs can be given: no `"` (its quoting has no
    escape), no control characters, no `.` or `..` segments."""
    if not path.startswith("/"):
        path = "/" + path
    if any(c in path for c in '"\n\r\t\x00'):
        raise ValueError(f"path {path!r}: quotes and control characters are not supported")
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise ValueError(f"path {path!r} must not contain . or ..")
    return "/" + "/".join(parts)


def quote(path: str) -> str:
    return f'"{path}"'


_TYPES = {"regular": "file", "directory": "directory", "symlink": "symlink"}
_FIELD = re.compile(r"(\w+):\s+(\S+)")
_TIME = re.compile(r"^\s*(a|m|c)time:\s+0x([0-9a-f]+)(?::([0-9a-f]+))?", re.M)
_LINK = re.compile(r'^Fast link dest: "(.*)"$', re.M)


def parse_stat(text: str) -> Inode:
    """`stat <path>`'s output."""
    fields: dict[str, str] = {}
    for line in text.splitlines()[:3]:
        for key, value in _FIELD.findall(line):
            fields.setdefault(key, value)
    if "Inode" not in fields:
        raise DebugfsError(f"unexpected stat output: {text[:200]!r}")
    times: dict[str, datetime] = {}
    for which, secs, extra in _TIME.findall(text):
        seconds = int(secs, 16)
        nanos = 0
        if extra:
            bits = int(extra, 16)
            seconds += (bits & 3) << 32  # epoch bits: dates past 2038
            nanos = bits >> 2
        times[which] = datetime.fromtimestamp(seconds + nanos / 1e9, UTC)
    epoch = datetime.fromtimestamp(0, UTC)
    link = _LINK.search(text)
    return Inode(
        type=_TYPES.get(fields.get("Type", ""), "unknown"),
        mode=int(fields.get("Mode", "0"), 8),
        uid=int(fields.get("User", "0")),
        gid=int(fields.get("Group", "0")),
        size=int(fields.get("Size", "0")),
        atime=times.get("a", epoch),
        mtime=times.get("m", epoch),
        ctime=times.get("c", epoch),
        target=link.group(1) if link else None,
    )


def parse_ls(text: str) -> list[Listed]:
    """`ls -p <dir>`'s output, without `.` and `..`."""
    out = []
    for line in text.splitlines():
        if not line.startswith("/"):
            continue
        parts = line.split("/")
        # "", inode, mode, uid, gid, name, size, "" — a name never holds "/"
        if len(parts) < 8:
            continue
        name = "/".join(parts[5:-2])
        if name in (".", ".."):
            continue
        out.append(
            Listed(
                int(parts[1]),
                int(parts[2], 8),
                int(parts[3]),
                int(parts[4]),
                name,
                int(parts[-2] or 0),
            )
        )
    return out


def split_sections(stdout: str) -> list[str]:
    """The output of a `-f` script, one section per command (debugfs echoes each command
    as `debugfs: <command>` before its output)."""
    sections: list[str] = []
    current: list[str] | None = None
    for line in stdout.splitlines():
        if line.startswith("debugfs: "):
            if current is not None:
                sections.append("\n".join(current))
            current = []
        elif current is not None:
            current.append(line)
    if current is not None:
        sections.append("\n".join(current))
    return sections


def _errors(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith("debugfs ")]


async def run(image: Path, commands: list[str], *, write: bool = False) -> list[str]:
    """Run `commands` on `image` in one debugfs; each command's output. The first error
    debugfs reports is raised (`NotFoundError` when a path was not found)."""
    argv = [DEBUGFS, *(["-w"] if write else []), "-f", "-", str(image)]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate(("\n".join(commands) + "\n").encode())
    errors = _errors(err.decode(errors="replace"))
    if errors:
        first = errors[0]
        if "not found" in first.lower() or "no such file" in first.lower():
            raise NotFoundError(first)
        raise DebugfsError(first)
    return split_sections(out.decode(errors="replace"))


async def replay_journal(image: Path) -> None:
    """A file system its guest left without unmounting (a crash) has a journal to replay
    before anything reads or writes it: debugfs does not, and a later mount's replay would
    undo what debugfs wrote."""
    proc = await asyncio.create_subprocess_exec(
        E2FSCK,
        "-p",
        "-E",
        "journal_only",
        str(image),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    if proc.returncode not in (0, 1):  # 1: errors corrected (the journal replayed)
        raise DebugfsError(f"e2fsck: {(err or out).decode(errors='replace').strip()[:300]}")
