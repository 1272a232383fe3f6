"""Kernel command line, digests, cache publication, injection into a tree."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from workers.node.image import cache
from workers.node.image.build import GuestImage, find_image, scripts_hash
from workers.node.image.cmdline import CMDLINE_BASE, kernel_cmdline, parse_cpu_khz
from workers.node.image.disk import parse_size
from workers.node.image.errors import ImageError
from workers.node.image.fsutil import guest_path
from workers.node.image.inject import add_user, envd_hash, guest_python, inject
from workers.node.image.rootfs import DebootstrapSpec


def test_cmdline_contract() -> None:
    assert kernel_cmdline(CMDLINE_BASE, khz=2445430) == (
        "console=ttyS0 quiet panic=-1 tsc_early_khz=2445430 tsc=reliable cryptomgr.notests "
        "vmroot=ext4 vmip=169.254.0.21/30 vmgw=169.254.0.22"
    )
    line = kernel_cmdline(CMDLINE_BASE, khz=1, ip=None, debug=True, extra={"vminit": "/x"})
    assert "vmip" not in line and "vmgw" not in line
    assert line.endswith("vmdebug=1 vminit=/x")
    with pytest.raises(ValueError):
        kernel_cmdline(CMDLINE_BASE, khz=1, extra={"a": "b c"})


def test_cpu_khz_parsing() -> None:
    text = "processor\t: 0\nmodel name\t: AMD EPYC\ncpu MHz\t\t: 2445.430\ncache size\t: 512 KB\n"
    assert parse_cpu_khz(text) == 2445430
    with pytest.raises(ValueError):
        parse_cpu_khz("processor: 0\n")


def test_sizes() -> None:
    assert parse_size("2G") == 2 << 30
    assert parse_size("512M") == 512 << 20
    assert parse_size("1536MiB") == 1536 << 20
    assert parse_size("4096") == 4096
    with pytest.raises(ImageError):
        parse_size("lots")


def test_digests_are_stable_and_input_sensitive(tmp_path: Path) -> None:
    a = {"source": DebootstrapSpec().key(), "size": 1}
    b = {"size": 1, "source": DebootstrapSpec().key()}
    assert cache.digest_of(a) == cache.digest_of(b)
    assert cache.digest_of(a) != cache.digest_of({**a, "size": 2})
    spec2 = DebootstrapSpec(packages=(*DebootstrapSpec().packages, "git"))
    assert cache.digest_of(spec2.key()) != cache.digest_of(DebootstrapSpec().key())
    # package order does not matter, content does
    shuffled = DebootstrapSpec(packages=tuple(reversed(DebootstrapSpec().packages)))
    assert shuffled.key() == DebootstrapSpec().key()
    assert len(scripts_hash()) == 64

    envd = tmp_path / "envd"
    (envd / "sub").mkdir(parents=True)
    (envd / "__init__.py").write_text("")
    (envd / "sub/x.py").write_text("a = 1\n")
    h1 = envd_hash(envd)
    (envd / "notes.txt").write_text("ignored")
    (envd / "__pycache__").mkdir()
    (envd / "__pycache__/x.py").write_text("ignored")
    assert envd_hash(envd) == h1
    (envd / "sub/x.py").write_text("a = 2\n")
    assert envd_hash(envd) != h1


def test_stale_staging_dirs_are_cleared_under_the_lock(tmp_path: Path) -> None:
    root = cache.cache_root(tmp_path)
    (root / ".tmp-k-dead").mkdir()
    (root / ".tmp-other-dead").mkdir()
    with cache.locked(root, "k"):
        pass
    assert not (root / ".tmp-k-dead").exists()
    assert (root / ".tmp-other-dead").exists()


def test_find_image_by_name_and_incomplete_dirs(tmp_path: Path) -> None:
    root = cache.cache_root(tmp_path)
    d = root / "f00"
    d.mkdir()
    for n in ("vmlinux", "initrd.cpio", "root.ext4"):
        (d / n).write_bytes(b"x")
    (d / "manifest.json").write_text(json.dumps({"digest": "f00", "kernel_cmdline_base": "x"}))
    cache.link_name(root, "mine", "f00")
    img = find_image("mine", root)
    assert isinstance(img, GuestImage) and img.digest == "f00" and img.rootfs == d / "root.ext4"
    (d / "root.ext4").unlink()
    with pytest.raises(ImageError, match=r"lacks root\.ext4"):
        find_image("f00", root)
    with pytest.raises(ImageError, match="no image"):
        find_image("nothing", root)


def _mini_tree(root: Path, python: str | None = "3.11") -> Path:
    (root / "etc").mkdir(parents=True)
    (root / "etc/passwd").write_text(
        "root:x:0:0:root:/root:/bin/bash\nubuntu:x:1000:1000::/home/ubuntu:/bin/sh\n"
    )
    (root / "etc/group").write_text("root:x:0:\nsudo:x:27:\nubuntu:x:1000:\n")
    (root / "etc/shadow").write_text("root:*:19000:0:99999:7:::\n")
    (root / "bin").mkdir()
    (root / "bin/bash").write_text("")
    if python:
        (root / f"usr/lib/python{python}").mkdir(parents=True)
        (root / f"usr/lib/python{python}/os.py").write_text("")
        (root / "usr/bin").mkdir(parents=True)
        (root / "usr/bin/python3").symlink_to(f"python{python}")
    return root


def test_the_images_python_is_recorded_not_required(tmp_path: Path) -> None:
    """envd runs on its own runtime: an image without python3, or with an old one, is fine."""
    assert guest_python(_mini_tree(tmp_path / "a")) == (3, 11)
    assert guest_python(_mini_tree(tmp_path / "b", python=None)) is None
    assert guest_python(_mini_tree(tmp_path / "c", python="3.7")) == (3, 7)
    info = inject(_mini_tree(tmp_path / "d", python=None), image_info={"digest": "d"})
    assert info.python is None


def test_add_user_picks_a_free_uid_and_is_idempotent(tmp_path: Path) -> None:
    root = _mini_tree(tmp_path)
    uid, gid = add_user(root)
    assert (uid, gid) == (1001, 1001)  # 1000 belongs to `ubuntu` in this image
    assert add_user(root) == (uid, gid)
    passwd = (root / "etc/passwd").read_text().splitlines()
    assert passwd.count("user:x:1001:1001::/home/user:/bin/bash") == 1
    assert "sudo:x:27:user" in (root / "etc/group").read_text()
    assert "NOPASSWD: ALL" in (root / "etc/sudoers.d/90-aenv-user").read_text()
    assert (root / "home/user").stat().st_uid == uid


def test_inject_never_writes_through_image_symlinks(tmp_path: Path) -> None:
    root = _mini_tree(tmp_path / "root")
    victim = tmp_path / "host-file"
    victim.write_text("host data")
    (root / "etc/hosts").symlink_to(victim)  # absolute: would hit the host if followed
    (root / "opt").symlink_to(tmp_path / "host-opt")
    info = inject(root, image_info={"digest": "d"})
    assert victim.read_text() == "host data"
    assert not (tmp_path / "host-opt").exists()
    assert (root / "etc/hosts").is_file() and not (root / "etc/hosts").is_symlink()
    assert "aenv" in (root / "etc/hosts").read_text()
    # /opt is an absolute symlink in this image: the runtime's mount point is made where the
    # guest resolves it, inside the tree, and left empty (envd is not in the image)
    mount = guest_path(root, "opt/aenv", follow_last=True)
    assert str(mount).startswith(str(root)) and mount.is_dir() and not any(mount.iterdir())
    assert stat.S_IMODE((root / "tmp").stat().st_mode) == 0o1777
    record = root / "etc/aenv/image.json"
    assert json.loads(record.read_text())["user_uid"] == info.user_uid


def test_inject_changes_no_file_in_place(tmp_path: Path) -> None:
    """An unpacked tree's files are hard links into the node's unpacked-layer cache (shared
    with other images' trees): injecting must replace files, never change one's content or
    owner in place."""
    if os.geteuid() != 0:
        pytest.skip("the shadow group is set only as root")
    root = _mini_tree(tmp_path / "root")
    (root / "etc/group").write_text("root:x:0:\nsudo:x:27:\nshadow:x:42:\n")
    (root / "etc/gshadow").write_text("root:*::\nuser:!::\n")  # kept as it is
    cached = tmp_path / "cache"
    subprocess.run(["cp", "-al", str(root), str(cached)], check=True)
    before = {
        f: (f.read_bytes(), f.stat().st_uid, f.stat().st_gid, f.stat().st_mode)
        for f in cached.rglob("*")
        if f.is_file() and not f.is_symlink()
    }
    inject(root, image_info={"digest": "d"})
    after = {
        f: (f.read_bytes(), f.stat().st_uid, f.stat().st_gid, f.stat().st_mode) for f in before
    }
    assert after == before
    assert (root / "etc/gshadow").stat().st_gid == 42  # the image's own copy has it
    assert (root / "etc/shadow").stat().st_gid == 42


def test_gc_keeps_newest_named_and_open_images(tmp_path: Path) -> None:
    root = cache.cache_root(tmp_path)
    dirs = []
    for i, name in enumerate(["old-named", "old-open", "old", "new"]):
        d = root / name
        d.mkdir()
        (d / "root.ext4").write_bytes(b"x")
        (d / "manifest.json").write_text("{}")
        os.utime(d / "manifest.json", (1000 + i, 1000 + i))
        dirs.append(d)
    (root / "kernel-x").mkdir()  # not an image: never touched
    cache.link_name(root, "tmpl", "old-named")
    with (root / "old-open/root.ext4").open("rb"):
        assert cache.collect_garbage(root, keep=1, dry_run=True) == [root / "old"]
        assert (root / "old").exists()
        assert cache.collect_garbage(root, keep=1) == [root / "old"]
    assert not (root / "old").exists()
    assert all((root / n).exists() for n in ("old-named", "old-open", "new", "kernel-x"))


def test_stale_staging_with_a_mount_is_detached_before_removal(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting needs root")
    root = cache.cache_root(tmp_path)
    stale = root / ".tmp-k-dead"
    (stale / "proc").mkdir(parents=True)
    keep = tmp_path / "precious"
    keep.mkdir()
    (keep / "file").write_text("must survive")
    subprocess.run(["mount", "--bind", str(keep), str(stale / "proc")], check=True)
    try:
        with cache.locked(root, "k"):
            pass
    finally:
        subprocess.run(["umount", "-l", str(stale / "proc")], capture_output=True)
    assert (keep / "file").read_text() == "must survive"
    assert not stale.exists()
    assert str(stale) not in Path("/proc/self/mounts").read_text()
