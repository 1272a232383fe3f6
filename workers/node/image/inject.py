"""Turn any root tree (debootstrap or OCI) into an aenv guest root.

Changes only what E2B's envd would: the E2B user `user` (uid 1000, passwordless sudo),
hostname/hosts/resolv.conf (the node may rewrite them), an empty /opt/aenv where envd's
runtime disk is mounted at boot (`runtime.py`: envd, its Python and PID 1 live there, not
in the image), and a record of what was found (`/etc/aenv/image.json`). The tree may come
from an untrusted image, so nothing here executes the image's binaries (no chroot) and
every write is resolved inside the tree.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from .errors import ImageError
from .fsutil import guest_mkdir, guest_path, remove_any, write_guest_file

USER = "user"
USER_UID = 1000
HOSTNAME = "aenv"
_PYLIB = re.compile(r"^python3\.(\d+)$")


@dataclass(frozen=True)
class GuestInfo:
    """What injection found and chose; recorded in the image manifest."""

    python: str | None  # the image's own python3 ("3.11"), if any: envd does not use it
    user_uid: int
    user_gid: int


def envd_files(src: Path) -> list[Path]:
    """envd's Python sources, relative to `src` (no caches, no tests), sorted."""
    if not src.is_dir():
        raise ImageError(f"envd source directory {src} does not exist")
    return sorted(
        p.relative_to(src)
        for p in src.rglob("*.py")
        if "__pycache__" not in p.parts and "tests" not in p.relative_to(src).parts
    )


def envd_hash(src: Path) -> str:
    """sha256 over envd's file names and contents: changes whenever envd changes."""
    h = hashlib.sha256()
    for rel in envd_files(src):
        data = (src / rel).read_bytes()
        h.update(f"{rel.as_posix()}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def guest_python(root: Path) -> tuple[int, int] | None:
    """Highest python3.N the tree ships (from its stdlib directory), or None. Informational:
    envd runs on its own runtime. Read from the tree rather than by running the
    interpreter: we never execute an image's binaries on the host."""
    found: list[tuple[int, int]] = []
    for libdir in ("usr/lib", "usr/local/lib", "lib"):
        base = guest_path(root, libdir, follow_last=True)
        if not base.is_dir():
            continue
        for entry in base.iterdir():
            m = _PYLIB.match(entry.name)
            if m and (entry / "os.py").exists():
                found.append((3, int(m.group(1))))
    has_binary = any(
        guest_path(root, b).is_symlink() or guest_path(root, b).exists()
        for b in ("usr/bin/python3", "usr/local/bin/python3", "bin/python3")
    )
    if not found or not has_binary:
        return None
    return max(found)


def _read_db(root: Path, name: str) -> list[list[str]]:
    p = guest_path(root, f"etc/{name}", follow_last=True)
    if not p.is_file():
        return []
    return [line.split(":") for line in p.read_text().splitlines() if line.strip()]


def _write_db(root: Path, name: str, rows: list[list[str]], mode: int) -> None:
    text = "".join(":".join(r) + "\n" for r in rows)
    write_guest_file(root, f"etc/{name}", text.encode(), mode=mode)


def _free_id(taken: set[int], wanted: int) -> int:
    i = wanted
    while i in taken:
        i += 1
    return i


def add_user(root: Path) -> tuple[int, int]:
    """Create `user` (uid 1000 unless taken) with a home and passwordless sudo, sans chroot.

    Idempotent: an existing `user` keeps its ids. Returns (uid, gid).
    """
    passwd = _read_db(root, "passwd")
    group = _read_db(root, "group")
    if not any(r[0] == "root" for r in passwd):
        passwd.insert(0, ["root", "x", "0", "0", "root", "/root", "/bin/sh"])
        group.insert(0, ["root", "x", "0", ""])
    existing = next((r for r in passwd if r[0] == USER and len(r) >= 7), None)
    if existing is not None:
        uid, gid = int(existing[2]), int(existing[3])
    else:
        grp_row = next((r for r in group if r[0] == USER and len(r) >= 3), None)
        if grp_row is not None:
            gid = int(grp_row[2])
        else:
            gid = _free_id({int(r[2]) for r in group if len(r) >= 3 and r[2].isdigit()}, USER_UID)
            group.append([USER, "x", str(gid), ""])
        uid = _free_id({int(r[2]) for r in passwd if len(r) >= 3 and r[2].isdigit()}, USER_UID)
        shell = (
            "/bin/bash" if guest_path(root, "bin/bash", follow_last=True).exists() else "/bin/sh"
        )
        passwd.append([USER, "x", str(uid), str(gid), "", "/home/user", shell])
    for r in group:  # the sudo group too, for tools that check membership
        if r[0] == "sudo" and len(r) >= 4:
            members = [m for m in r[3].split(",") if m]
            if USER not in members:
                r[3] = ",".join([*members, USER])
    _write_db(root, "passwd", passwd, 0o644)
    _write_db(root, "group", group, 0o644)
    shadow = _read_db(root, "shadow")
    if not any(r[0] == USER for r in shadow):
        shadow.append([USER, "*", "19000", "0", "99999", "7", "", "", ""])
    _write_db(root, "shadow", shadow, 0o640)
    gshadow = _read_db(root, "gshadow")
    if gshadow and not any(r[0] == USER for r in gshadow):
        gshadow.append([USER, "!", "", ""])
        _write_db(root, "gshadow", gshadow, 0o640)
    _fix_shadow_group(root)
    home = guest_mkdir(root, "home/user", mode=0o755, uid=uid, gid=gid)
    skel = guest_path(root, "etc/skel", follow_last=True)
    if skel.is_dir():
        for f in skel.iterdir():
            if f.is_file() and not f.is_symlink() and not (home / f.name).exists():
                write_guest_file(root, f"home/user/{f.name}", f.read_bytes(), uid=uid, gid=gid)
    write_guest_file(
        root,
        "etc/sudoers.d/90-aenv-user",
        f"{USER} ALL=(ALL:ALL) NOPASSWD: ALL\n".encode(),
        mode=0o440,
    )
    return uid, gid


def _fix_shadow_group(root: Path) -> None:
    # Debian keeps /etc/shadow root:shadow 0640; keep that group if the tree has one
    gid = next((int(r[2]) for r in _read_db(root, "group") if r[0] == "shadow"), None)
    if gid is not None and os.geteuid() == 0:
        for name in ("shadow", "gshadow"):
            p = guest_path(root, f"etc/{name}")
            if p.is_file() and not p.is_symlink():
                # rewritten, not chowned: it may be a hard link into the unpacked-layer cache
                mode = stat.S_IMODE(p.lstat().st_mode)
                write_guest_file(root, f"etc/{name}", p.read_bytes(), mode=mode, gid=gid)


def inject(root: Path, *, image_info: dict[str, object]) -> GuestInfo:
    """Add `user`, /etc files and the runtime's mount point to the tree at `root`."""
    py = guest_python(root)
    for d in ("dev", "proc", "sys", "tmp", "run", "root"):
        guest_mkdir(root, d, mode=0o1777 if d == "tmp" else 0o755)
    # the runtime's mount point, empty (an image may ship a stale aenv of its own)
    remove_any(guest_path(root, "opt/aenv"))
    guest_mkdir(root, "opt/aenv")
    uid, gid = add_user(root)
    write_guest_file(root, "etc/hostname", f"{HOSTNAME}\n".encode())
    hosts = (
        f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{HOSTNAME}\n"
    )
    write_guest_file(root, "etc/hosts", hosts.encode())
    write_guest_file(root, "etc/resolv.conf", b"# aenv: the node writes resolvers here\n")
    info = GuestInfo(python=None if py is None else f"{py[0]}.{py[1]}", user_uid=uid, user_gid=gid)
    meta = {**image_info, "python": info.python, "user_uid": uid, "user_gid": gid}
    write_guest_file(root, "etc/aenv/image.json", (json.dumps(meta, indent=2) + "\n").encode())
    return info
