"""Real microVMs: the `base` guest image (built once, cached by digest), a runtime on a
private state dir and slot prefix, and a template snapshot every test restores from."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from e2b import Sandbox
from e2b.connection_config import ConnectionConfig
from packaging.version import Version

from envd.version import ENVD_VERSION
from tests.support import tagged
from workers.node.image import GuestImage, kernel_cmdline
from workers.node.net import list_leftovers
from workers.node.runtime import ENVD_PORT, Runtime, Snapshot, Vm

PREFIX = tagged("aenvt")

pytestmark = pytest.mark.vm


def _our_qemus(state_dir: Path) -> list[str]:
    out = subprocess.run(["pgrep", "-af", "qemu-system"], capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if str(state_dir) in line]


@pytest.fixture(scope="package")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    d = tmp_path_factory.mktemp("aenv-state")
    yield d
    # The contract of the runtime: after close(), nothing of ours is left on the host.
    assert _our_qemus(d) == [], "QEMU processes leaked"
    assert list_leftovers(PREFIX) == [], "network namespaces leaked"
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f"{PREFIX}h" not in links, "host veth ends leaked"


@pytest.fixture(scope="package")
async def runtime(guest_image: GuestImage, state_dir: Path) -> AsyncIterator[Runtime]:
    rt = await Runtime.open(state_dir, kernel_for_probe=guest_image.kernel, slot_prefix=PREFIX)
    try:
        yield rt
    finally:
        await rt.close()


async def boot_base(rt: Runtime, image: GuestImage, mem_mib: int = 512) -> Vm:
    vm = await rt.boot(
        kernel=image.kernel,
        initrd=image.initrd,
        rootfs=image.rootfs,
        cmdline=kernel_cmdline(image),
        mem_mib=mem_mib,
    )
    await rt.wait_envd(vm)
    return vm


@pytest.fixture(scope="package")
async def template(runtime: Runtime, guest_image: GuestImage) -> Snapshot:
    """The `base` template: booted once until envd answers, then captured."""
    vm = await boot_base(runtime, guest_image)
    return await runtime.capture(vm, resume=False)


def sdk(vm: Vm) -> Sandbox:
    """The real e2b SDK, pointed straight at this guest's envd (no control plane here)."""
    config = ConnectionConfig(api_key="unused", sandbox_url=f"http://{vm.host}:{ENVD_PORT}")
    return Sandbox(
        sandbox_id=vm.vm_id,
        sandbox_domain=None,
        envd_version=Version(ENVD_VERSION),
        envd_access_token=None,
        connection_config=config,
    )
