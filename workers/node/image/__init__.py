"""Guest image builder: kernel + initramfs + ext4 root for aenv's QEMU microVMs.

See docs/guest-image.md for what is in a guest, how images are cached and the boot
contract (kernel command-line knobs, console markers, fixed IP/MAC).
"""

from .build import (
    FORMAT_VERSION,
    GuestImage,
    base_rootfs_tree,
    build_base,
    build_from_oci,
    find_image,
)
from .cache import CACHE_ENV, DEFAULT_CACHE, cache_root
from .cmdline import CMDLINE_BASE, GUEST_GW, GUEST_IP, GUEST_MAC, kernel_cmdline, tsc_khz
from .errors import ImageError
from .runtime import RuntimeDisk, build_runtime, find_runtime
from .scripts import ENVD_PORT

__all__ = [
    "CACHE_ENV",
    "CMDLINE_BASE",
    "DEFAULT_CACHE",
    "ENVD_PORT",
    "FORMAT_VERSION",
    "GUEST_GW",
    "GUEST_IP",
    "GUEST_MAC",
    "GuestImage",
    "ImageError",
    "RuntimeDisk",
    "base_rootfs_tree",
    "build_base",
    "build_from_oci",
    "build_runtime",
    "cache_root",
    "find_image",
    "find_runtime",
    "kernel_cmdline",
    "tsc_khz",
]
