"""Ports handed out on this machine, by any process, in the last `HOLD_S` seconds.

`free_port` finds a port nobody listens on, but the server it is for binds it seconds
later (SeaweedFS starts four servers, each on two ports). Within one process `_GIVEN`
keeps two servers apart; two processes starting stacks at once — CI's VM-less lane beside
its VM lane, pytest workers, a fleet rig beside a test — each saw the same port free and
one server failed (`s3 failed to listen on grpc port …: address already in use`). So a
port handed out is claimed for every process of the machine: a marker file per port whose
age says when, picked under one lock file (`flock`), so a claim is checked and made at
once. A claim older than `HOLD_S` has lapsed: its server is listening by then (or never
will), and the bind test decides. Where the claims directory cannot be used (another
user's, read-only), ports are handed out as before, unclaimed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["DEFAULT_DIR", "HOLD_S", "claimed", "claims"]

DEFAULT_DIR = Path(tempfile.gettempdir()) / "aenv-ports"
#: How long a port handed out stays another process's: far longer than a server's start.
HOLD_S = 180.0


@contextlib.contextmanager
def claims(directory: Path = DEFAULT_DIR) -> Iterator[Path | None]:
    """The claims directory, locked for this process while the block runs; None (no
    claims) when it cannot be made or locked."""
    try:
        directory.mkdir(exist_ok=True)
        with contextlib.suppress(PermissionError):  # made by another user: theirs to set
            directory.chmod(0o1777)  # every user's stacks claim in one place
        fd = os.open(directory / ".lock", os.O_CREAT | os.O_RDWR, 0o666)
    except OSError:
        yield None
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield directory
    finally:
        os.close(fd)  # releases the lock


def claimed(directory: Path, port: int, now: float | None = None) -> bool:
    """True when another claim on `port` holds; else claim it (under `claims`' lock)."""
    marker = directory / str(port)
    now = time.time() if now is None else now
    try:
        if now - marker.stat().st_mtime < HOLD_S:
            return True
    except FileNotFoundError:
        pass
    try:
        marker.touch()
        os.utime(marker, (now, now))
    except OSError:  # another user's lapsed claim: leave it, take the port unclaimed
        pass
    return False
