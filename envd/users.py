"""Guest users: who a request acts as, their home, and paths resolved the way envd does."""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    home: str

    @property
    def is_current(self) -> bool:
        """True when envd already runs as this user (no setuid needed, nor possible)."""
        return self.uid == os.geteuid()

    def groups(self) -> list[int]:
        """Supplementary groups, as initgroups(3) would set them."""
        try:
            return os.getgrouplist(self.name, self.gid)
        except OSError:
            return [self.gid]


def lookup(name: str) -> User:
    """The user called `name`; KeyError if there is none."""
    pw = pwd.getpwnam(name)
    return User(pw.pw_name, pw.pw_uid, pw.pw_gid, pw.pw_dir or "/")


def current() -> User:
    uid = os.geteuid()
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return User(str(uid), uid, os.getegid(), os.environ.get("HOME", "/"))
    return User(pw.pw_name, pw.pw_uid, pw.pw_gid, pw.pw_dir or "/")


def lookup_or_current(name: str) -> User:
    """The configured default user, or envd's own user where it does not exist (host tests)."""
    try:
        return lookup(name)
    except KeyError:
        return current()


def resolve_path(path: str, user: User, default_dir: str | None = None) -> str:
    """Absolute, normalised path: "~" is the user's home, relative paths start at the home,
    an empty path is `default_dir` (or the home). Mirrors envd's ExpandAndResolve."""
    if not path:
        path = default_dir or user.home
    if path == "~":
        path = user.home
    elif path.startswith("~/"):
        path = os.path.join(user.home, path[2:])
    if not os.path.isabs(path):
        path = os.path.join(user.home, path)
    path = os.path.normpath(path)
    # procfs's `self` is whoever opens it: listings run in a forked child (`offload`),
    # whose /proc entry is gone once it exited. E2B's envd opens such paths itself:
    # `self` is envd.
    if path == "/proc/self" or path.startswith("/proc/self/"):
        return f"/proc/{os.getpid()}" + path[len("/proc/self") :]
    return path
