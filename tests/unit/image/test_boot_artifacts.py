"""cpio writer, initramfs contents, PVH kernel extraction, module ordering."""

from __future__ import annotations

import io
import lzma
import os
import shutil
import stat
import struct
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from workers.node.image import elf
from workers.node.image.cpio import CpioWriter
from workers.node.image.errors import ImageError
from workers.node.image.initramfs import build_initramfs, read_static_busybox
from workers.node.image.kernel import (
    Kernel,
    KernelPackage,
    ModuleSpec,
    extract_vmlinux,
    load_order,
    module_depends,
    module_name,
    parse_depends,
)


def fake_elf(notes: Sequence[tuple[bytes, int, bytes]] = (), interp: bool = False) -> bytes:
    """A minimal x86-64 ELF64 with one PT_NOTE segment (and optionally a PT_INTERP)."""
    blob = b""
    for name, ntype, desc in notes:
        n = name + b"\0"
        blob += struct.pack("<III", len(n), len(desc), ntype)
        blob += n + b"\0" * (-len(n) % 4) + desc + b"\0" * (-len(desc) % 4)
    phnum = 2 if interp else 1
    note_off = 64 + 56 * phnum
    hdr = b"\x7fELF" + bytes([2, 1, 1]) + b"\0" * 9
    hdr += struct.pack("<HHIQQQIHHHHHH", 2, 62, 1, 0, 64, 0, 0, 64, 56, phnum, 64, 0, 0)
    ph = struct.pack("<IIQQQQQQ", elf.PT_NOTE, 4, note_off, 0, 0, len(blob), len(blob), 4)
    if interp:
        ph += struct.pack("<IIQQQQQQ", elf.PT_INTERP, 4, note_off, 0, 0, 0, 0, 1)
    return hdr + ph + blob


PVH_NOTE = (b"Xen", elf.XEN_ELFNOTE_PHYS32_ENTRY, struct.pack("<I", 0x1000000))


def bzimage_around(payload: bytes) -> bytes:
    return b"MZ" + b"\0" * 500 + lzma.compress(payload, format=lzma.FORMAT_XZ) + b"\0" * 64


def test_extract_vmlinux_finds_the_pvh_kernel() -> None:
    vmlinux = fake_elf([(b"GNU", 3, b"build-id"), PVH_NOTE])
    assert extract_vmlinux(bzimage_around(vmlinux)) == vmlinux


def test_kernel_without_pvh_note_is_refused() -> None:
    with pytest.raises(ImageError, match="PVH"):
        extract_vmlinux(bzimage_around(fake_elf([(b"Xen", 0x11, b"xx")])))
    with pytest.raises(ImageError, match="XZ"):
        extract_vmlinux(b"MZ" + b"\0" * 100)


def test_static_check() -> None:
    assert elf.is_static(fake_elf())
    assert not elf.is_static(fake_elf(interp=True))


def test_host_busybox_is_static() -> None:
    if not Path("/bin/busybox").exists():
        pytest.skip("busybox-static not installed")
    assert read_static_busybox()[:4] == b"\x7fELF"


def test_dynamic_busybox_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "busybox"
    fake.write_bytes(fake_elf(interp=True))
    with pytest.raises(ImageError, match="dynamically linked"):
        read_static_busybox(fake)


def test_module_names_and_apt_depends() -> None:
    assert module_name("kernel/fs/ext4/ext4.ko.xz") == "ext4"
    assert module_name("crc32c-intel.ko") == "crc32c_intel"
    out = "linux-image-amd64\n  Depends: linux-image-6.1.0-57-amd64\n"
    assert parse_depends(out) == "linux-image-6.1.0-57-amd64"
    assert KernelPackage("linux-image-6.1.0-57-amd64", "6.1.192-3").release == "6.1.0-57-amd64"
    with pytest.raises(ImageError):
        parse_depends("linux-image-amd64\n")


def test_load_order_puts_dependencies_first_and_skips_builtins() -> None:
    deps = {
        "ext4": ["jbd2", "mbcache", "crc16"],
        "jbd2": [],
        "mbcache": [],
        "crc16": [],
        "virtio_blk": ["virtio", "virtio_ring"],
        "virtio": [],
        "virtio_ring": [],
    }
    order = load_order(deps.get, ["kernel/lib/crc16.ko"], ["virtio_blk", "ext4"])
    assert order == ["virtio", "virtio_ring", "virtio_blk", "jbd2", "mbcache", "ext4"]
    with pytest.raises(ImageError, match="nope"):
        load_order(deps.get, [], ["nope"])


def test_module_depends_reads_modinfo() -> None:
    # a relocatable ELF with a .modinfo section, as the kernel build writes it
    modinfo = b"license=GPL\0depends=virtio,virtio_ring\0name=virtio_blk\0"
    shstr = b"\0.modinfo\0.shstrtab\0"
    body_off = 64
    shoff = body_off + len(modinfo) + len(shstr)
    hdr = b"\x7fELF" + bytes([2, 1, 1]) + b"\0" * 9
    hdr += struct.pack("<HHIQQQIHHHHHH", 1, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, 3, 2)

    def sh(name: int, off: int, size: int) -> bytes:
        return struct.pack("<IIQQQQIIQQ", name, 1, 0, 0, off, size, 0, 0, 1, 0)

    data = hdr + modinfo + shstr + sh(0, 0, 0) + sh(1, 64, len(modinfo))
    data += sh(10, 64 + len(modinfo), len(shstr))
    assert module_depends(data) == ["virtio", "virtio_ring"]


def test_cpio_archive_is_readable_by_gnu_cpio(tmp_path: Path) -> None:
    if shutil.which("cpio") is None:
        pytest.skip("cpio not installed")
    buf = io.BytesIO()
    w = CpioWriter(buf)
    w.add_dir("bin")
    w.add_file("bin/hello", b"hello world\n", 0o755)
    w.add_file("odd", b"x" * 5)
    w.add_symlink("bin/sh", "hello")
    w.add_chardev("console", 5, 1)
    w.close()
    data = buf.getvalue()
    assert len(data) % 4 == 0
    listing = subprocess.run(
        ["cpio", "-it", "--quiet"], input=data, capture_output=True, check=True
    ).stdout.decode()
    assert listing.split() == ["bin", "bin/hello", "odd", "bin/sh", "console"]
    out = tmp_path / "x"
    out.mkdir()
    subprocess.run(["cpio", "-idm", "--quiet"], input=data, cwd=out, check=True)
    assert (out / "bin/hello").read_bytes() == b"hello world\n"
    assert stat.S_IMODE((out / "bin/hello").stat().st_mode) == 0o755
    assert (out / "odd").read_bytes() == b"xxxxx"
    assert (out / "bin/sh").readlink() == Path("hello")
    st = (out / "console").lstat()
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(5, 1)


def test_initramfs_loads_modules_in_order(tmp_path: Path) -> None:
    mods = []
    for name, req in (("virtio", True), ("virtio_blk", True), ("erofs", False)):
        p = tmp_path / f"{name}.ko"
        p.write_bytes(name.encode())
        mods.append(ModuleSpec(name, p, req))
    kernel = Kernel(KernelPackage("linux-image-x", "1"), tmp_path / "vmlinux", tuple(mods))
    busybox = fake_elf()
    data = build_initramfs(kernel, busybox)
    out = tmp_path / "unpacked"
    out.mkdir()
    subprocess.run(["cpio", "-idm", "--quiet"], input=data, cwd=out, check=True)
    init = (out / "init").read_text()
    assert init.startswith("#!/bin/busybox sh")
    assert init.index("ld virtio\n") < init.index("ld virtio_blk\n") < init.index("ldo erofs\n")
    assert "switch_root /newroot" in init and "AENV-INIT-FAIL" in init
    assert (out / "bin/busybox").read_bytes() == busybox
    assert (out / "lib/modules/virtio_blk.ko").read_bytes() == b"virtio_blk"
    assert stat.S_ISCHR((out / "dev/console").lstat().st_mode)
