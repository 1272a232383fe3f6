"""The host's side of this node's templates: an image imported as one, a sandbox's
snapshot adopted as one, a template forgotten, and the captures the snapshot worker
uploads of them. The warm pool's VMs of a template go whenever its capture changes."""

from __future__ import annotations

from collections.abc import Callable

from shared.lazybase import base_size
from workers.node.hosted import LocalCapture, UploadedTemplate
from workers.node.image.supply import ImageSupply
from workers.node.imports import import_image
from workers.node.ports import ImageSource, ImportedImage
from workers.node.runtime import Runtime, Snapshot
from workers.node.templates import TemplateCatalog, TemplateSpec
from workers.node.warm import WarmPool

__all__ = ["HostTemplates"]


class HostTemplates:
    def __init__(
        self,
        runtime: Runtime,
        templates: TemplateCatalog,
        warm: WarmPool | None,
        collect_soon: Callable[[], None],
        images: ImageSupply | None = None,
    ) -> None:
        self.runtime = runtime
        self.templates = templates
        self.warm = warm
        #: a dropped capture's layers are freed by layer GC
        self.collect_soon = collect_soon
        #: how a registry image's bytes come here: built once per fleet (`imports.py`)
        self.images = images

    async def import_image(
        self,
        name: str,
        source: ImageSource,
        *,
        vcpus: int,
        mem_mib: int,
        progress: Callable[[str], None] | None = None,
    ) -> ImportedImage:
        """An image becomes a template on this node: a registry reference's image fetched
        from the fleet or pulled into the layer cache and converted (cached by content),
        then booted once, captured and adopted (so a restart keeps it)."""
        image = await import_image(
            name,
            source,
            progress,
            free_bytes=self.templates.free_bytes,
            supply=self.images,
            budget=self.images.budget if self.images is not None else None,
        )
        if self.warm is not None:  # an import again under a name: the old VMs go
            await self.warm.drain(name, forget=False)
        self.templates.register(TemplateSpec(name, vcpus=vcpus, mem_mib=mem_mib), lambda: image)
        if progress is not None:
            progress(f"booting {name} once until envd answers, then capturing it")
        snap = await self.templates.get(name)
        self.templates.adopt(name, snap, None)
        return ImportedImage(image.digest, base_size(image.rootfs) >> 20)  # or a stub's

    async def adopt_snapshot(
        self, name: str, snap: Snapshot, token: str | None, sandbox_id: str
    ) -> None:
        """A sandbox's persistent snapshot becomes template `name`."""
        old = self.templates.forget(name)
        self.templates.adopt(name, snap, token, sandbox_id)
        if old is not None:  # a new build of an existing name replaces the old capture
            if self.warm is not None:  # its warm VMs were restored from the old one
                await self.warm.drain(name, forget=False)
            self.runtime.delete_snapshot(old)

    async def forget(self, name: str) -> None:
        if self.warm is not None:
            await self.warm.drain(name)
        snap = self.templates.forget(name)
        if snap is not None:
            self.runtime.delete_snapshot(snap)
            self.collect_soon()

    def capture(self, name: str) -> LocalCapture | None:
        snap = self.templates.capture_of(name)
        return LocalCapture.of(snap) if snap is not None else None

    def uploaded(self, name: str, snapshot_id: str) -> UploadedTemplate | None:
        snap = self.templates.capture_of(name)
        if snap is None or snap.snapshot_id != snapshot_id:
            return None
        if not self.templates.mark_uploaded(name, snap):
            return None
        return UploadedTemplate(self.templates.source_of(name))
