"""Template snapshots: a template is booted once until envd answers, then captured.

Every sandbox of a template restores that capture, which is the fast path all latency
goals are about. Captures are keyed by the image digest and the machine fingerprint, so a
new envd, image or QEMU never restores a stale snapshot: it builds a fresh one.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass

from workers.node.image import GuestImage, build_base, kernel_cmdline
from workers.node.runtime import Runtime, Snapshot, init_envd

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


class TemplateError(Exception):
    """A template is unknown or could not be built."""


@dataclass(frozen=True)
class TemplateSpec:
    """Shape of a template's VMs; fixed at build time (a snapshot cannot change them)."""

    name: str
    vcpus: int = 1
    mem_mib: int = 512


class TemplateCatalog:
    """Resolves a template name to its captured snapshot, building it on first use."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        progress: Progress | None = None,
        base: TemplateSpec | None = None,
    ) -> None:
        self.runtime = runtime
        self.progress = progress or (lambda m: log.info("template: %s", m))
        self._specs: dict[str, TemplateSpec] = {"base": base or TemplateSpec("base")}
        self._images: dict[str, Callable[[], GuestImage]] = {
            "base": lambda: build_base(progress=self.progress)
        }
        self._ready: dict[str, Snapshot] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def known(self) -> list[str]:
        return sorted(self._specs)

    def captures(self) -> list[Snapshot]:
        """Template captures built so far (their layers are shared by every sandbox)."""
        return list(self._ready.values())

    def register(self, spec: TemplateSpec, image: Callable[[], GuestImage]) -> None:
        self._specs[spec.name] = spec
        self._images[spec.name] = image
        self._ready.pop(spec.name, None)

    async def get(self, name: str) -> Snapshot:
        if name in self._ready:
            return self._ready[name]
        if name not in self._specs:
            raise TemplateError(f"template {name!r} not found")
        async with self._locks.setdefault(name, asyncio.Lock()):
            if name not in self._ready:
                self._ready[name] = await self._build(self._specs[name])
        return self._ready[name]

    async def _build(self, spec: TemplateSpec) -> Snapshot:
        image = await asyncio.to_thread(self._images[spec.name])
        machine = self.runtime.machine(vcpus=spec.vcpus, mem_mib=spec.mem_mib)
        snap_id = f"tpl-{spec.name}-{image.digest[:16]}-{machine.fingerprint()}"
        sdir = self.runtime.state_dir / "snapshots" / snap_id
        if (sdir / "manifest.json").exists():
            snap = Snapshot.read(sdir)
            if snap.disk_top.exists():
                return snap
        self.progress(f"booting {spec.name} ({image.digest[:12]}) until envd answers")
        vm = await self.runtime.boot(
            kernel=image.kernel,
            initrd=image.initrd,
            rootfs=image.rootfs,
            cmdline=kernel_cmdline(image),
            vcpus=spec.vcpus,
            mem_mib=spec.mem_mib,
        )
        try:
            took = await self.runtime.wait_envd(vm)
        except BaseException:
            await self.runtime.destroy(vm)
            raise
        # One /init before the capture: envd imports what /init needs lazily, and under TCG
        # those imports would otherwise be paid by every sandbox's first request.
        await init_envd(vm.host, None)
        self.progress(f"{spec.name}: envd answered after {took:.1f}s; capturing")
        if sdir.exists():  # a half-written capture from a crash: start over
            shutil.rmtree(sdir)
        return await self.runtime.capture(vm, resume=False, snapshot_id=snap_id)
