"""A node's runtime with real microVMs under a disk budget, for the budget's VM tests: the
runtime per module (its own state dir and slot prefix, the module's `PREFIX`), templates
booted to envd and captured, and the budget wired as the composition root wires it (the
module's `HEADROOM`)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import pytest

from workers.node.disk import DiskUsage
from workers.node.disk.budget import DiskBudget
from workers.node.disk.evict import Entry
from workers.node.disk.evictor import CacheEvictor
from workers.node.image import GuestImage, build_base, kernel_cmdline
from workers.node.runtime import Runtime, Snapshot


@pytest.fixture(scope="module")
def guest_image() -> GuestImage:
    if os.geteuid() != 0:
        pytest.skip("microVM tests need root (netns, tap)")
    return build_base(progress=lambda msg: print(f"[image] {msg}", flush=True))


@pytest.fixture(scope="module")
async def runtime(
    guest_image: GuestImage,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> AsyncIterator[Runtime]:
    state = tmp_path_factory.mktemp(f"aenv-{request.module.__name__.rsplit('.', 1)[-1]}")
    prefix = request.module.PREFIX
    rt = await Runtime.open(state, kernel_for_probe=guest_image.kernel, slot_prefix=prefix)
    try:
        yield rt
    finally:
        await rt.close()


async def boot_template(runtime: Runtime, guest_image: GuestImage, mem_mib: int) -> Snapshot:
    """A template as a build makes one: booted until envd answered, then captured."""
    vm = await runtime.boot(
        kernel=guest_image.kernel,
        initrd=guest_image.initrd,
        rootfs=guest_image.rootfs,
        cmdline=kernel_cmdline(guest_image),
        mem_mib=mem_mib,
    )
    await runtime.wait_envd(vm)
    return await runtime.capture(vm, resume=False)


@pytest.fixture
def evicted() -> list[Entry]:
    return []


@pytest.fixture
def budget(
    runtime: Runtime, evicted: list[Entry], request: pytest.FixtureRequest
) -> Iterator[DiskBudget]:
    """The node's budget over its state dir, wired as the composition root wires it."""
    evictor = CacheEvictor(None, runtime.state_dir)
    b = DiskBudget(
        DiskUsage(runtime.state_dir, None),
        1 << 50,
        headroom=request.module.HEADROOM,
        evictor=evictor,
        on_evicted=evicted.append,
    )
    runtime.disk_budget = runtime.ram_pool.disk = b
    evictor.ram_pool = runtime.ram_pool
    try:
        yield b
    finally:
        runtime.disk_budget = runtime.ram_pool.disk = None
