"""Fixtures for guest image tests: the cached base image (built once per cache)."""

from __future__ import annotations

import os
import shutil

import pytest

from workers.node.image import GuestImage, build_base


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (debootstrap, mkfs with root-owned files)"
    for tool in ("qemu-system-x86_64", "qemu-img", "debootstrap", "mkfs.ext4", "apt-get"):
        if shutil.which(tool) is None:
            return f"{tool} not installed (scripts/setup.sh)"
    return None


@pytest.fixture(scope="session")
def base_image() -> GuestImage:
    """The default image from the shared cache ($AENV_IMAGE_CACHE), built if missing."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    return build_base(progress=lambda m: print(f"[image] {m}", flush=True))
