"""Template captures as disk budget entries (images-at-scale S8): an uploaded one may go,
its record kept, and the next create of its template pulls it back from the repository
(`TemplateCatalog._missing` → `TemplateNotLocal` → `Transfers._pull_template`, which
fetches its base image by content if that went too). One not uploaded is the only copy
and never goes; nor does one a running sandbox or a warm VM was restored from.

A capture stands on its base image and runtime disk (`Entry.holds`): those go only after
it. Its qcow2 layers are freed by layer GC once nothing needs them (`collect_soon`), and
the next walk counts that.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from workers.node.disk.evict import Entry
from workers.node.disk.usage import allocated
from workers.node.runtime import Snapshot

__all__ = ["CaptureHost", "TemplateCaptures"]

log = logging.getLogger(__name__)


class _Catalog(Protocol):
    def captures(self) -> list[Snapshot]: ...

    def held(self) -> tuple[str, ...]: ...

    def ready(self, name: str) -> Snapshot | None: ...

    def uploaded_id(self, name: str, snap: Snapshot) -> str | None: ...

    def evict(self, name: str, snap: Snapshot) -> bool: ...


class _Runtime(Protocol):
    def delete_snapshot(self, snap: Snapshot) -> None: ...


class CaptureHost(Protocol):
    """What of the host the captures' side reads (`SandboxHost` has it)."""

    @property
    def templates(self) -> _Catalog: ...

    @property
    def runtime(self) -> _Runtime: ...

    def collect_soon(self) -> None: ...


def image_key(disk: Path) -> str | None:
    """The cache entry (`images/<content>`) a disk file lies in, as the evictor keys it."""
    return str(disk.parent) if disk.parent.parent.name == "images" else None


class TemplateCaptures:
    """This node's template captures, listed and evicted from the budget's thread."""

    def __init__(
        self,
        host: CaptureHost,
        busy: Callable[[], Iterable[str]],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.host = host
        #: templates a running sandbox or warm VM was restored from
        self.busy = busy
        self.loop = loop
        self._names: dict[str, str] = {}  # entry key -> template name

    def entries(self) -> list[Entry]:
        out = []
        catalog = self.host.templates
        for name in catalog.held():
            snap = catalog.ready(name)
            if snap is None:
                continue
            holds = tuple(
                k for f in (snap.base_image, snap.runtime_disk) if (k := image_key(f)) is not None
            )
            key = str(snap.dir)
            self._names[key] = name
            out.append(
                Entry(
                    key,
                    "capture",
                    allocated(snap.dir),
                    _stamp(snap.dir),
                    uploaded=catalog.uploaded_id(name, snap) is not None,
                    holds=holds,
                )
            )
        return out

    def in_use(self) -> set[str]:
        catalog = self.host.templates
        busy = set(self.busy())
        return {str(s.dir) for n in catalog.held() if n in busy and (s := catalog.ready(n))}

    def remove(self, entry: Entry) -> int:
        name = self._names.get(entry.key)
        snap = self.host.templates.ready(name) if name is not None else None
        if name is None or snap is None or not self.host.templates.evict(name, snap):
            return 0  # moved on meanwhile, or not uploaded after all: kept
        self.host.runtime.delete_snapshot(snap)
        self.loop.call_soon_threadsafe(self.host.collect_soon)  # its layers, by layer GC
        log.info("disk budget: evicted the capture of template %s (uploaded)", name)
        return entry.bytes


def _stamp(directory: Path) -> float:
    try:
        return directory.stat().st_mtime
    except OSError:
        return 0.0
