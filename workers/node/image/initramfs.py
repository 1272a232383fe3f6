"""The initramfs: static busybox, the boot modules and the `/init` script, as newc cpio.

Left uncompressed: under TCG the kernel's gzip inflate costs more than reading the extra
~3 MB (measured in vmm-notes §2.3).
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

from . import elf
from .cpio import CpioWriter
from .errors import ImageError
from .kernel import Kernel
from .scripts import initramfs_init

HOST_BUSYBOX = Path("/bin/busybox")  # Debian's busybox-static


def read_static_busybox(path: Path = HOST_BUSYBOX) -> bytes:
    """The host's busybox binary; it must be static since it runs before any libc exists."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ImageError(f"cannot read {path}: {e} (install busybox-static)") from e
    try:
        static = elf.is_static(data)
    except elf.ElfFormatError as e:
        raise ImageError(f"{path} is not an x86-64 executable: {e}") from e
    if not static:
        raise ImageError(f"{path} is dynamically linked; install busybox-static")
    return data


def init_script(kernel: Kernel) -> str:
    """The `/init` text for this kernel's module set."""
    return initramfs_init((m.name, m.required) for m in kernel.modules)


def build_initramfs(kernel: Kernel, busybox: bytes) -> bytes:
    """The complete cpio archive (bytes; ~6 MB)."""
    buf = io.BytesIO()
    w = CpioWriter(buf)
    for d in ("bin", "dev", "lib", "lib/modules", "newroot", "proc", "sys", "tmp", "run"):
        w.add_dir(d)
    # the kernel opens /dev/console for init's stdio before our devtmpfs is mounted
    w.add_chardev("dev/console", 5, 1)
    w.add_file("bin/busybox", busybox, 0o755)
    w.add_symlink("bin/sh", "busybox")
    for m in kernel.modules:
        w.add_file(f"lib/modules/{m.name}.ko", m.path.read_bytes())
    w.add_file("init", init_script(kernel).encode(), 0o755)
    w.close()
    return buf.getvalue()


def sha256_hex(data: bytes) -> str:
    """Hex sha256 of `data` (recorded in manifests)."""
    return hashlib.sha256(data).hexdigest()
