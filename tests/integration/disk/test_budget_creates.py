"""Creates under one disk budget, with real microVMs (issue 42): a node's runtime restores
sandboxes of three templates in turn — each its own RAM file, as a sandbox that may pause
gets — under a budget that leaves room for about one, the RAM pool's copies under it too.
Each restore reserves its RAM file before it writes and is charged what it left; a sampler
walks the state dir ten times a second outside the ledger: the disk never holds more than
the budget, and after each create the ledger counts at least what is there. A create that
cannot fit is refused `unavailable` and leaves nothing behind."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest
from e2b import Sandbox
from e2b.connection_config import ConnectionConfig
from packaging.version import Version

from envd.version import ENVD_VERSION
from tests.integration.disk.conftest import boot_template
from tests.support import tagged
from workers.node.disk import STATE, scan
from workers.node.disk.budget import DiskBudget, NoRoom
from workers.node.image import GuestImage
from workers.node.runtime import ENVD_PORT, Runtime, Snapshot, Vm
from workers.node.runtime.diskroom import VM_EXTRA

pytestmark = [pytest.mark.vm, pytest.mark.slow, pytest.mark.timeout(1200)]

MiB = 1 << 20
PREFIX = tagged("aenvd")
HEADROOM = 96 * MiB  # what the running guest's RAM file and top layer grow by unasked
SIZES = (256, 384, 512)  # the templates' memory (MiB)


class Sampler:
    """The state dir's use (`usage.scan`, what the budget counts) at 10 Hz, in a thread."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, scan([(STATE, self.state)]).total)
            self.samples += 1
            self._stop.wait(0.1)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture(scope="module")
async def templates(runtime: Runtime, guest_image: GuestImage) -> list[Snapshot]:
    """Templates of three sizes."""
    return [await boot_template(runtime, guest_image, mem_mib) for mem_mib in SIZES]


def _sdk(vm: Vm) -> Sandbox:
    config = ConnectionConfig(api_key="unused", sandbox_url=f"http://{vm.host}:{ENVD_PORT}")
    return Sandbox(
        sandbox_id=vm.vm_id,
        sandbox_domain=None,
        envd_version=Version(ENVD_VERSION),
        envd_access_token=None,
        connection_config=config,
    )


async def test_creates_of_three_templates_stay_under_the_budget(
    runtime: Runtime, templates: list[Snapshot], budget: DiskBudget
) -> None:
    budget.walk()
    held = budget.used()
    # room for one sandbox of the largest template and little more: the RAM pool's copies
    # take what is free, and a create evicts them when it needs the room
    biggest = max(t.machine.mem_mib for t in templates) << 20  # a VM may fill its RAM file
    budget.budget = held + HEADROOM + biggest + VM_EXTRA + 64 * MiB
    print(f"held {held >> 20} MiB before, budget {budget.budget >> 20} MiB")
    with Sampler(runtime.state_dir) as sampler:
        for round_ in range(2):  # the second round restores from the pool's copies
            for t in templates:
                vm, _ = await runtime.restore(t, private_memory=False)
                try:
                    out = await asyncio.to_thread(
                        lambda vm=vm: _sdk(vm).commands.run("echo up").stdout
                    )
                    assert out.strip() == "up"
                    real = scan([(STATE, runtime.state_dir)]).total
                    assert budget.accounted() >= real, (round_, t.machine.mem_mib, real)
                finally:
                    await runtime.destroy(vm)
                await runtime.teardowns.drain()
                await runtime.ram_pool.idle()
                assert budget.accounted() >= scan([(STATE, runtime.state_dir)]).total
                budget.walk()  # the node walks soon after a kill (`NodeDisk.changed`)
    print(f"{sampler.samples} samples, peak {sampler.peak >> 20} MiB")
    assert sampler.samples >= 10
    assert 0 < sampler.peak <= budget.budget, (sampler.peak >> 20, budget.budget >> 20)


async def test_a_create_that_cannot_fit_is_refused_unavailable(
    runtime: Runtime, templates: list[Snapshot], budget: DiskBudget
) -> None:
    for t in templates:  # nothing evictable: the RAM pool holds no copies
        runtime.ram_pool.forget(t.mem)
    await runtime.ram_pool.idle()
    budget.walk()
    budget.budget = budget.used() + HEADROOM + VM_EXTRA  # no room for a RAM file
    vms = runtime.state_dir / "vms"
    before = set(os.listdir(vms)) if vms.is_dir() else set()
    with pytest.raises(NoRoom) as refused:
        await runtime.restore(templates[-1], private_memory=False)
    assert refused.value.code == "unavailable"
    assert (set(os.listdir(vms)) if vms.is_dir() else set()) == before
    assert budget.reserved() == 0
