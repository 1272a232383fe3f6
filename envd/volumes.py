"""Volumes in the guest: E2B's `volumeMounts`, mounted by `/init` and let go before the
node takes the VM down.

Every VM has a few volume slots (block devices the node attaches at boot, `vmm/spec.py`):
a slot without a volume reads zeros; a restore may give a slot a volume's image (an ext4
that fills the device) instead. The guest tells slots apart by their serial (`aenv-vol<i>`
in /sys/block/vdX/serial), not by probe order. The kernel may have cached reads of the
placeholder (its partition scan at boot, before the template was captured), so the
device's buffers are flushed (BLKFLSBUF) before the file system on it is mounted.

Mounting is idempotent: a resume with memory restores a guest whose volumes are mounted
already (its page cache holds the file system): /init then leaves them alone.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from envd import log

__all__ = ["Mount", "mount_all", "parse_mounts", "release_all"]

BLKFLSBUF = 0x1261
FIFREEZE = 0xC0045877
MS_NOATIME = 1024
#: discard: a file deleted in the guest is a hole punched in the host's image (space and
#: upload saved); noinit_itable: no background zeroing of inode tables the host's mkfs left
#: as holes (they read as zeros already; zeroing would only allocate them)
OPTIONS = b"discard,noinit_itable"
SYS_BLOCK = Path("/sys/block")

_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.mount.argtypes = [
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_ulong,
            ctypes.c_char_p,
        ]
        _libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return _libc


class VolumeError(Exception):
    """A volume could not be mounted; the message says which and why."""


@dataclass(frozen=True)
class Mount:
    name: str
    path: str
    serial: str


def parse_mounts(raw: object) -> list[Mount]:
    """`/init`'s `volumeMounts`: [{name, path, serial}] (ValueError when malformed)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError("volumeMounts must be a list")
    out = []
    for item in raw:
        if not isinstance(item, dict):
            raise ValueError("each volume mount must be an object")
        name, path, serial = item.get("name"), item.get("path"), item.get("serial")
        if not all(isinstance(v, str) and v for v in (name, path, serial)):
            raise ValueError("a volume mount needs name, path and serial")
        assert isinstance(name, str) and isinstance(path, str) and isinstance(serial, str)
        if not os.path.isabs(path):
            raise ValueError(f"volume mount path {path!r} is not absolute")
        out.append(Mount(name, os.path.normpath(path), serial))
    return out


def device_of(serial: str) -> str:
    """/dev/vdX of the disk whose serial is `serial`."""
    for disk in sorted(SYS_BLOCK.glob("vd*")):
        try:
            if (disk / "serial").read_text().strip() == serial:
                return f"/dev/{disk.name}"
        except OSError:
            continue
    raise VolumeError(f"no disk with serial {serial} (this VM has no such volume slot)")


def mounted_from(path: str) -> str | None:
    """The device mounted at `path`, or None (from /proc/self/mountinfo)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    found = None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 2 and _unescape(fields[4]) == path:
            found = tail[1]  # the last mount at a path is the one in effect
    return found


def _unescape(field: str) -> str:
    return (
        field.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
    )


def mount_one(m: Mount, uid: int, gid: int) -> str:
    """Mount volume `m`; what happened (for the log)."""
    device = device_of(m.serial)
    if mounted_from(m.path) == device:
        return "mounted already"
    os.makedirs(m.path, exist_ok=True)
    fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, BLKFLSBUF)  # the placeholder's cached sectors must not be read
    finally:
        os.close(fd)
    lib = _lib()
    if lib.mount(device.encode(), m.path.encode(), b"ext4", MS_NOATIME, OPTIONS) != 0:
        e = ctypes.get_errno()
        raise VolumeError(
            f"volume {m.name}: mount of {device} at {m.path} failed: {os.strerror(e)}"
        )
    # a fresh file system's root is root's: the sandbox's default user may write it
    st = os.stat(m.path)
    if st.st_uid == 0 and set(os.listdir(m.path)) <= {"lost+found"} and uid != 0:
        os.chown(m.path, uid, gid)
    return "mounted"


def mount_all(mounts: list[Mount], uid: int, gid: int) -> None:
    for m in mounts:
        how = mount_one(m, uid, gid)
        log.info("volume", name=m.name, path=m.path, result=how)


def release_all(paths: list[str]) -> dict[str, str]:
    """Before the node stops the VM: every write on the volumes flushed, each unmounted —
    or, when something still uses it, frozen (FIFREEZE flushes and quiesces the file
    system: the image is then as clean as after an unmount). Path → what happened."""
    os.sync()
    out: dict[str, str] = {}
    lib = _lib()
    for path in paths:
        if mounted_from(path) is None:
            out[path] = "not mounted"
            continue
        if lib.umount2(path.encode(), 0) == 0:
            out[path] = "unmounted"
            continue
        e = ctypes.get_errno()
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                fcntl.ioctl(fd, FIFREEZE, 0)
            finally:
                os.close(fd)
            out[path] = f"frozen (unmount: {errno.errorcode.get(e, e)})"
        except OSError as fe:
            out[path] = f"synced only ({fe})"
    log.info("volumes released", **out)
    return out
