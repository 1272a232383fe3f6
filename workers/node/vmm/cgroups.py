"""Where the node's VM cgroups go: under the node's own cgroup, so a VM's memory and CPU
count against the service that started it (systemd's unit with `Delegate=yes`, a
container's or a pod's cgroup), not in a group beside it at the hierarchy's root.

cgroup v2 forbids processes in a cgroup whose children have controllers enabled (the
"no internal processes" rule), so with v2 the node first moves the processes of its own
cgroup into a `node` child, then enables memory and cpu for its children and puts VMs
under `vms/`. That is only done where the cgroup is the node's to rearrange: one systemd
delegated to it (its `trusted.delegate` / `user.delegate` attribute), or a cgroup
namespace's root (a container: `0::/`). Anywhere else — a developer's shell session —
the node keeps today's group at the hierarchy's root and says why once. v1 has no such
rule: VMs go in `<own path>/aenv` of each controller's hierarchy when that is writable.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["GROUP", "Placement", "discover"]

log = logging.getLogger(__name__)

#: the group (v1, and v2 outside a delegated cgroup) the VMs' cgroups are made in
GROUP = "aenv"
_WANT = ("memory", "cpu")


@dataclass(frozen=True)
class Placement:
    """Where VM cgroups are made, found once per node process."""

    #: 2 or 1 (cgroup version), 0: none writable (VMs run uncapped)
    version: int
    #: v2: the one parent; v1: the memory and the cpu parents, in that order
    parents: tuple[Path, ...]
    #: the parents are inside the node's own cgroup (its service's or container's)
    inside: bool
    #: why this placement, for the log and the readiness warnings
    reason: str


def discover(
    root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc/self/cgroup")
) -> Placement:
    """Find (and, for a delegated v2 cgroup, prepare) where VM cgroups go."""
    try:
        lines = proc.read_text().splitlines()
    except OSError as e:
        return Placement(0, (), False, f"cannot read {proc}: {e}")
    if _controllers(root / "cgroup.controllers") >= set(_WANT):
        return _v2(root, _own(lines, ""))
    unified = root / "unified"
    if _controllers(unified / "cgroup.controllers") >= set(_WANT):  # hybrid, v2-controlled
        return _v2(unified, _own(lines, ""))
    return _v1(root, lines)


def _controllers(path: Path) -> set[str]:
    try:
        return set(path.read_text().split())
    except OSError:
        return set()


def _own(lines: list[str], controller: str) -> str:
    """This process's cgroup path in the hierarchy of `controller` ("" = the v2 one)."""
    for line in lines:
        _, names, path = line.split(":", 2)
        if (controller == "" and names == "") or controller in names.split(","):
            return path
    return "/"


def _delegated(own: Path, rel: str) -> bool:
    """Whether this cgroup is the node's to rearrange (see the module docstring)."""
    if rel == "/":  # a cgroup namespace's root: a container's own hierarchy — unless
        # it holds kernel threads (no executable): then it is a host's root cgroup
        return not any(_kernel_thread(pid) for pid in _procs(own))
    for attr in ("trusted.delegate", "user.delegate"):
        with contextlib.suppress(OSError):
            if os.getxattr(own, attr) == b"1":
                return True
    return False


def _procs(cgroup: Path) -> list[str]:
    try:
        return (cgroup / "cgroup.procs").read_text().split()
    except OSError:
        return []


def _kernel_thread(pid: str) -> bool:
    try:
        os.readlink(f"/proc/{pid}/exe")
    except FileNotFoundError:
        return Path(f"/proc/{pid}").exists()  # (not: a process that ended meanwhile)
    except OSError:
        return False
    return False


def _v2(root: Path, rel: str) -> Placement:
    own = root / rel.lstrip("/")
    if _delegated(own, rel) and _controllers(own / "cgroup.controllers") >= set(_WANT):
        try:
            node = own / "node"
            node.mkdir(exist_ok=True)
            for pid in _procs(own):
                with contextlib.suppress(ProcessLookupError):  # (it ended meanwhile)
                    (node / "cgroup.procs").write_text(pid)
            (own / "cgroup.subtree_control").write_text("+memory +cpu")
            vms = own / "vms"
            vms.mkdir(exist_ok=True)
            (vms / "cgroup.subtree_control").write_text("+memory +cpu")
            return Placement(2, (vms,), True, f"cgroup v2, in the node's own cgroup {rel}")
        except OSError as e:
            why = f"its own cgroup {rel} could not be prepared ({e})"
    else:
        why = f"its own cgroup {rel} is not delegated to it (systemd: Delegate=yes)"
    parent = root / GROUP
    try:
        parent.mkdir(exist_ok=True)
        with contextlib.suppress(OSError):  # (set already, or by whoever owns the root)
            (root / "cgroup.subtree_control").write_text("+memory +cpu")
        (parent / "cgroup.subtree_control").write_text("+memory +cpu")
    except OSError as e:
        return Placement(0, (), False, f"cgroup v2: {why}, and {parent} is not writable: {e}")
    return Placement(2, (parent,), False, f"cgroup v2 at {parent}: {why}")


def _v1(root: Path, lines: list[str]) -> Placement:
    parents: list[Path] = []
    inside = True
    for controller in _WANT:
        rel = _own(lines, controller).lstrip("/")
        mine = root / controller / rel / GROUP
        try:
            mine.mkdir(parents=True, exist_ok=True)
        except OSError:
            inside = False
            mine = root / controller / GROUP
            try:
                mine.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                return Placement(0, (), False, f"cgroup v1 {controller} is not writable: {e}")
        parents.append(mine)
    where = "in the node's own cgroups" if inside else "at the hierarchies' roots"
    return Placement(1, tuple(parents), inside, f"cgroup v1, {where}")
