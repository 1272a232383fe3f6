"""The real Debian kernel package: download, unpack, PVH vmlinux, boot modules."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from workers.node.image import elf
from workers.node.image.kernel import REQUIRED_MODULES, ensure_kernel, resolve_package

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_fresh_kernel_cache_from_the_debian_package(tmp_path: Path) -> None:
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        pytest.skip("needs apt-get and dpkg-deb")
    package = resolve_package(progress=lambda _m: None)
    assert package.name.startswith("linux-image-") and package.name.endswith("-amd64")
    kernel = ensure_kernel(tmp_path, package, progress=lambda _m: None)
    data = kernel.vmlinux.read_bytes()
    assert elf.has_pvh_entry(data)
    names = [m.name for m in kernel.modules]
    assert set(REQUIRED_MODULES) <= set(names)
    # dependencies come first: virtio before virtio_blk, jbd2 and mbcache before ext4
    assert names.index("virtio") < names.index("virtio_blk")
    assert names.index("jbd2") < names.index("ext4") and names.index("mbcache") < names.index(
        "ext4"
    )
    for m in kernel.modules:
        blob = m.path.read_bytes()
        assert blob[:4] == b"\x7fELF", f"{m.name} is not an uncompressed module"
        assert elf.modinfo(blob).get("name") == m.name
    # the second call is a cache hit and does not download again
    assert ensure_kernel(tmp_path, package, progress=pytest.fail) == kernel
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp")] == []
