"""Fixtures the integration packages share: the machine's guest image, which their
microVM tests boot (runtime, disk)."""

from __future__ import annotations

import os

import pytest

from workers.node.image import GuestImage, build_base


@pytest.fixture(scope="session")
def guest_image() -> GuestImage:
    if os.geteuid() != 0:
        pytest.skip("microVM tests need root (netns, tap)")
    return build_base(progress=lambda msg: print(f"[image] {msg}", flush=True))
