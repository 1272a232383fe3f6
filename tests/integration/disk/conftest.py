"""A node's runtime with real microVMs under a disk budget, for the budget's VM tests: the
runtime per module (its own state dir and slot prefix, the module's `PREFIX`), templates
booted to envd and captured, and the budget wired as the composition root wires it (the
module's `HEADROOM`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from tests.integration.runtime.conftest import boot_base
from workers.node.disk import DiskUsage
from workers.node.disk.budget import DiskBudget
from workers.node.disk.evict import Entry
from workers.node.disk.evictor import CacheEvictor
from workers.node.image import GuestImage
from workers.node.runtime import Runtime, Snapshot


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
    vm = await boot_base(runtime, guest_image, mem_mib)
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
