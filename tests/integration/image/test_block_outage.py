"""The node's supervisor against real failures of the real block service (issue 29, no VM):
a service that hangs (SIGSTOP: it accepts but never greets) is killed and restarted; one
that cannot start again (its cache dir made a file) is down for good past the window, and
the node is told once (`on_down`: it ends the VMs on lazy images), then it comes back when
the cause is gone; the node's wiring then ends only the sandboxes on lazy stubs, through
the death watch, with cause `block-service`, and drops the warm VMs on lazy stubs (their
"QEMU" a real process)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import cast

import pytest

from shared.lazybase import LAZY_ROOT
from tests.support import eventually
from workers.node.blockoutage import WHY
from workers.node.blockservice import BlockService, answers
from workers.node.deathwatch import DeathWatch
from workers.node.hosted import LiveSandbox
from workers.node.lazyend import end_lazy_vms
from workers.node.metrics import CAUSES
from workers.node.net.addressing import SlotAddress
from workers.node.net.slot import NetworkSlot
from workers.node.ports import GuestConfig
from workers.node.runtime import Runtime
from workers.node.runtime.vm import Vm
from workers.node.templates import TemplateCatalog
from workers.node.vmm.qemu import QemuVm
from workers.node.vmm.spec import Boot, LaunchSpec, Machine
from workers.node.warm import WarmPool, WarmVm
from workers.node.warmsize import WarmPolicy

WINDOW_S = 3.0


def _service(tmp: Path) -> BlockService:
    """The real service over an empty POSIX repository; socket and log outside its cache
    dir, so breaking the cache dir breaks the service, not the supervisor's own files."""
    socket, cache_dir = tmp / "run" / "blocks.sock", tmp / "cache"
    argv = [sys.executable, "-m", "aenv.roles.blocks", "serve", "--socket", str(socket)]
    argv += ["--cache-dir", str(cache_dir), "--cache-bytes", str(64 << 20)]
    return BlockService(
        argv,
        socket,
        cache_dir / "blocks.pid",
        log_file=tmp / "run" / "blocks.log",
        in_use_grace_s=0.5,
        window_s=WINDOW_S,
        probe_every_s=0.5,
        probe_timeout_s=1.0,
    )


@pytest.fixture
def repository(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("AENV_S3_ENDPOINT", raising=False)
    monkeypatch.setenv("AENV_SNAPSHOT_DIR", str(tmp_path / "store"))
    return tmp_path / "store"


async def test_a_hung_service_is_killed_and_restarted(tmp_path: Path, repository: Path) -> None:
    service = _service(tmp_path)
    downs: list[float] = []

    async def down() -> None:
        downs.append(time.monotonic())

    service.on_down = down
    await service.start()
    try:
        hung = service.pid
        assert hung is not None
        os.kill(hung, signal.SIGSTOP)  # alive, its socket bound, no greeting ever
        assert not await answers(service.socket, timeout=0.5)

        async def back() -> bool:
            return service.restarts == 1 and service.pid != hung

        await eventually(back, timeout=30)
        assert service.hangs == 1
        assert await answers(service.socket)
        assert not downs  # back within the window: no VM is ended
        assert not os.path.exists(f"/proc/{hung}")
    finally:
        await service.stop()


async def test_a_service_that_cannot_start_again_ends_its_vms_once_past_the_window(
    tmp_path: Path, repository: Path
) -> None:
    service = _service(tmp_path)
    downs: list[float] = []

    async def down() -> None:
        downs.append(time.monotonic())

    service.on_down = down
    await service.start()
    cache_dir = tmp_path / "cache"
    try:
        first = service.pid
        assert first is not None
        shutil.rmtree(cache_dir)
        cache_dir.write_text("not a directory")  # every start of the service fails now
        killed = time.monotonic()
        os.kill(first, signal.SIGKILL)

        async def told() -> bool:
            return len(downs) == 1

        await eventually(told, timeout=WINDOW_S + 30)
        assert downs[0] - killed >= WINDOW_S  # never before QEMU gives up on the reads
        assert service.restarts == 0 and not await answers(service.socket)

        cache_dir.unlink()  # the cause gone: the supervisor's next try brings it back

        async def back() -> bool:
            return service.restarts == 1 and await answers(service.socket)

        await eventually(back, timeout=60)
        assert service.outage.since is None and len(downs) == 1  # told once per outage
    finally:
        await service.stop()


async def _stand_in(tmp: Path, sid: str, base: Path) -> LiveSandbox:
    """A running sandbox whose "QEMU" is a real process (`sleep`) driven by the real
    `QemuVm`: the death watch ends and reaps it as it would QEMU, with no VM to boot."""
    work = tmp / sid
    work.mkdir()
    machine = Machine("7.2", "tcg", "max", 1, 256, "02:00:00:00:00:01")
    spec = LaunchSpec(
        sid, machine, work, work / "mem", False, work / "top.qcow2", tmp / "rt.ext4",
        Boot(tmp / "vmlinux", tmp / "initrd", ""),
    )  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        "sleep", "600", stdin=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    slot = NetworkSlot(SlotAddress(0, "ns0", "h0", "n0", "10.0.0.1", "10.0.0.2"))
    vm = Vm(sid, QemuVm(spec, proc), slot, work, machine, work / "mem", False,
            work / "top.qcow2", base, tmp / "rt.ext4")  # fmt: skip
    return LiveSandbox(sid, "t", vm, GuestConfig())


class _Teardown:
    """What the warm pool asks of the runtime when it drops a VM: its process killed (the
    runtime's own teardown also frees a slot and a directory these stand-ins do not have)."""

    async def destroy(self, vm: Vm, *, background: bool = False) -> None:
        await vm.qemu.kill()


async def test_the_node_ends_only_the_vms_on_lazy_stubs_with_a_cause(
    tmp_path: Path, repository: Path
) -> None:
    """The node's wiring (`aenv/roles/node.py`: `end_lazy_vms`): `on_down` ends, through the
    death watch, every running VM whose base is a lazy stub; each is reported as a death of
    cause `block-service` (the SandboxKilled and `aenv_vm_deaths_total{cause}`), the others
    run on. Warm VMs on lazy stubs leave the pool (no create is handed one); the rest stay."""
    sandboxes: dict[str, LiveSandbox] = {}
    locks: dict[str, asyncio.Lock] = {}
    deaths = DeathWatch(sandboxes, lambda sid: locks.setdefault(sid, asyncio.Lock()))
    died: list[tuple[str, str, str]] = []

    async def reported(sid: str, why: str, cause: str) -> None:
        sandboxes.pop(sid, None)
        died.append((sid, why, cause))

    deaths.died = reported
    lazy_base = tmp_path / "images" / "ab" / LAZY_ROOT
    whole_base = tmp_path / "images" / "cd" / "root.ext4"
    lazy = await _stand_in(tmp_path, "lazy", lazy_base)
    whole = await _stand_in(tmp_path, "whole", whole_base)
    for live in (lazy, whole):
        sandboxes[live.sandbox_id] = live
        deaths.watch(live)
    pool = WarmPool(cast(Runtime, _Teardown()), cast(TemplateCatalog, None), WarmPolicy())
    warm_lazy = (await _stand_in(tmp_path, "warm-lazy", lazy_base)).vm
    warm_whole = (await _stand_in(tmp_path, "warm-whole", whole_base)).vm
    pool._ready["t"] = [WarmVm("t", "s", vm, "secret", 256) for vm in (warm_lazy, warm_whole)]

    service = _service(tmp_path)
    service.on_down = lambda: end_lazy_vms(deaths, pool)
    await service.start()
    try:
        assert service.pid is not None
        shutil.rmtree(tmp_path / "cache")
        (tmp_path / "cache").write_text("")  # no start of the service succeeds
        os.kill(service.pid, signal.SIGKILL)

        async def ended() -> bool:
            return bool(died) and pool.stats().ready == {"t": 1}

        await eventually(ended, timeout=WINDOW_S + 30)
        assert died == [("lazy", WHY, "block-service")]
        assert not lazy.vm.qemu.alive and whole.vm.qemu.alive
        assert not warm_lazy.qemu.alive and warm_whole.qemu.alive
        assert [w.vm for w in pool._ready["t"]] == [warm_whole]
        assert "block-service" in CAUSES  # a label of its own, not counted as a crash
    finally:
        await service.stop()
        deaths.close()
        for vm in (lazy.vm, whole.vm, warm_lazy, warm_whole):
            await vm.qemu.kill()
