"""Where VM cgroups go (`workers/node/vmm/cgroups.py`), decided over a cgroup tree laid
out in a temporary directory as the kernel lays it out (the files it reads and writes):
the real hierarchy of this host is v1 and shared by every test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from workers.node.vmm.cgroups import discover


def _v2(root: Path, own: str, *, procs: list[str], delegate: bool = False) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text("")
    mine = root / own.lstrip("/")
    mine.mkdir(parents=True, exist_ok=True)
    (mine / "cgroup.controllers").write_text("cpu memory pids\n")
    (mine / "cgroup.procs").write_text("\n".join(procs) + "\n")
    if delegate:
        try:
            os.setxattr(mine, "user.delegate", b"1")
        except OSError as e:  # a file system without user xattrs
            pytest.skip(f"no user xattrs here: {e}")
    return mine


def _proc(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "self-cgroup"
    p.write_text(text)
    return p


def test_v2_delegated_service_cgroup_moves_its_processes_and_holds_the_vms(
    tmp_path: Path,
) -> None:
    """systemd's Delegate=yes: the unit's cgroup becomes node/ (its processes) + vms/."""
    root = tmp_path / "cg"
    unit = "/system.slice/aenv-node.service"
    mine = _v2(root, unit, procs=[str(os.getpid())], delegate=True)
    where = discover(root, _proc(tmp_path, f"0::{unit}\n"))
    assert (where.version, where.parents, where.inside) == (2, (mine / "vms",), True)
    assert (mine / "node" / "cgroup.procs").read_text() == str(os.getpid())
    assert (mine / "cgroup.subtree_control").read_text() == "+memory +cpu"
    assert (mine / "vms" / "cgroup.subtree_control").read_text() == "+memory +cpu"


def test_v2_container_root_is_the_nodes_own(tmp_path: Path) -> None:
    """In a container (cgroup namespace root `0::/`) the namespace's root is the node's."""
    root = tmp_path / "cg"
    _v2(root, "/", procs=[str(os.getpid())])
    where = discover(root, _proc(tmp_path, "0::/\n"))
    assert (where.version, where.parents, where.inside) == (2, (root / "vms",), True)
    assert (root / "node" / "cgroup.procs").read_text() == str(os.getpid())


def test_v2_host_root_or_undelegated_cgroup_is_left_alone(tmp_path: Path) -> None:
    """A host's root cgroup (kernel threads in it: kthreadd is pid 2) or a shell's session
    is not rearranged: the VMs go in `aenv/` at the root, said as not inside."""
    root = tmp_path / "cg"
    _v2(root, "/", procs=["2", str(os.getpid())])
    where = discover(root, _proc(tmp_path, "0::/\n"))
    assert (where.version, where.parents, where.inside) == (2, (root / "aenv",), False)
    assert not (root / "node").exists()

    other = tmp_path / "cg2"
    mine = _v2(other, "/user.slice/session-3.scope", procs=[str(os.getpid())])
    where = discover(other, _proc(tmp_path, "0::/user.slice/session-3.scope\n"))
    assert (where.version, where.parents, where.inside) == (2, (other / "aenv",), False)
    assert "not delegated" in where.reason and not (mine / "node").exists()


def test_v1_uses_each_controllers_own_path(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    for c in ("memory", "cpu"):
        (root / c).mkdir(parents=True)
    text = "9:name=systemd:/\n4:memory:/pod/abc\n2:cpu,cpuacct:/pod/abc\n0::/\n"
    where = discover(root, _proc(tmp_path, text))
    assert where.version == 1 and where.inside
    assert where.parents == (root / "memory/pod/abc/aenv", root / "cpu/pod/abc/aenv")
    assert all(p.is_dir() for p in where.parents)


def test_nothing_readable_means_no_caps(tmp_path: Path) -> None:
    where = discover(tmp_path / "cg", tmp_path / "missing")
    assert where.version == 0 and not where.parents and "cannot read" in where.reason
