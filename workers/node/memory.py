"""A `Host` with no VMs: sandboxes are records in memory. The other side of the VM port
(`workers/node/ports.py`) from `SandboxHost`, so the whole control plane — API → NATS → node
worker → events → projections — runs in a tier without QEMU or root (`AENV_NODE_HOST=memory`,
`tests/vmless/`), and a fleet simulator can run many nodes on one machine.

It keeps the host's contract, not its cost: capacity is enforced, a pause takes a capture
with an id of its own, a resume needs one, forks need room, a snapshot becomes a template
of this host, unknown templates fail the create (`unavailable`, as a template whose bytes
are nowhere does on a real node). Nothing survives the process (as VMs do
not survive a node's), and a guest has no address (`upstream` is None: no route is put).
`delay_s` makes each operation take that long, for simulations; `no_room_for` names the
templates (`*`: all) whose fetch it refuses as a full disk budget would (`NoRoom`): a node
that runs out of disk mid-create, for tests of placement.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workers.node.disk.budget import NoRoom, no_room_message
from workers.node.image.errors import ImageError
from workers.node.image.registry import parse_reference
from workers.node.ports import (
    Accelerator,
    Capture,
    Claim,
    Died,
    GuestConfig,
    HostError,
    ImageSource,
    ImportedImage,
    RamPoolStats,
    Stage,
    TemplateLocator,
    WarmStats,
)
from workers.node.volumes.images import version_key

__all__ = ["MemoryHost", "MemoryVolumes"]

log = logging.getLogger(__name__)


@dataclass
class _Sandbox:
    template_id: str
    guest: GuestConfig
    capture: str | None = None  # paused: its capture's id


class MemoryVolumes:
    """Volume images as records: the VM-less tier attaches and releases volumes in the log
    like any node. Like its pauses' captures, the version a holder leaves is a name with
    nothing behind it (`vol-<id>-<holder>`, 0 bytes): the log's shape, not durability."""

    def __init__(self) -> None:
        self._holders: dict[str, str] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def lock(self, volume_id: str) -> asyncio.Lock:
        return self._locks.setdefault(volume_id, asyncio.Lock())

    def held_by(self, holder: str) -> list[str]:
        return sorted(v for v, h in self._holders.items() if h == holder)

    async def prepare(self, volume_id: str, version: str | None, holder: str) -> Path:
        self._holders[volume_id] = holder
        return Path("/dev/null")

    async def upload(self, volume_id: str, holder: str) -> tuple[str, int] | None:
        if self._holders.get(volume_id) != holder:
            return None
        return version_key(volume_id, holder), 0

    def released(self, volume_id: str, version: str | None) -> None:
        self._holders.pop(volume_id, None)

    def forget_holder(self, volume_id: str) -> None:
        self._holders.pop(volume_id, None)


class MemoryHost:
    def __init__(
        self,
        *,
        capacity: int,
        templates: Iterable[str] = ("base",),
        delay_s: float = 0.0,
        no_room_for: Iterable[str] = (),
    ) -> None:
        self._capacity = capacity
        self.templates = set(templates)
        self.delay_s = delay_s
        self.no_room_for = frozenset(no_room_for)
        self.live: dict[str, _Sandbox] = {}
        self.paused: dict[str, _Sandbox] = {}
        #: the capture each resumed sandbox ran from, until its resume is recorded
        self.resumed_from: dict[str, str] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._hooks: list[Callable[[str], None]] = []
        self._stage: Stage = lambda op, stage, seconds, start: None
        self._volumes = MemoryVolumes()

    @property
    def volumes(self) -> MemoryVolumes:
        return self._volumes

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def free(self) -> int:
        return max(0, self._capacity - len(self.live))

    @property
    def running(self) -> int:
        return len(self.live)

    @property
    def paused_count(self) -> int:
        return len(self.paused)

    @property
    def accelerator(self) -> Accelerator:
        return Accelerator("none", "in-memory host: sandboxes without VMs", "memory")

    def runs(self, sandbox_id: str) -> bool:
        return sandbox_id in self.live

    def holds_paused(self, sandbox_id: str) -> bool:
        return sandbox_id in self.paused

    def held_capture(self, sandbox_id: str) -> str | None:
        held = self.paused.get(sandbox_id)
        return held.capture if held is not None else None

    def lock(self, sandbox_id: str) -> asyncio.Lock:
        return self._locks.setdefault(sandbox_id, asyncio.Lock())

    def upstream(self, sandbox_id: str) -> str | None:
        return None

    def on_gone(self, hook: Callable[[str], None]) -> None:
        self._hooks.append(hook)

    def on_died(self, hook: Died) -> None:
        return None  # records do not die on their own

    def on_stage(self, hook: Stage) -> None:
        self._stage = hook

    def vm_guest_ram(self) -> dict[int, int]:
        return {}  # no VMs: nothing costs the host

    async def _started(self, op: str) -> None:
        """A record's start, timed as a VM's would be: its `restore` is the simulated
        work (`delay_s`), its envd answers at once."""
        t0 = time.monotonic()
        await self._work()
        self._stage(op, "restore", time.monotonic() - t0, "cold")
        self._stage(op, "envd_ready", 0.0, "cold")

    def set_template_locator(self, locate: TemplateLocator) -> None:
        return None  # templates are this process's own: nothing to take over

    async def _work(self) -> None:
        await asyncio.sleep(self.delay_s)

    async def volume_slots(self, template_id: str) -> int:
        return 4  # as many as a VM has (`workers.node.vmm.VOLUME_SLOTS`)

    async def hold_template(self, template_id: str) -> None:
        """A template this host was told has no disk room (`no_room_for`) is refused as
        a real node's fetch would be; one it does not have, as one whose bytes are nowhere
        (it has no repository to fetch from)."""
        if template_id in self.no_room_for or "*" in self.no_room_for:
            raise NoRoom(
                f"the capture of template {template_id!r} could not be fetched: "
                + no_room_message(2 << 30, 0, 0)
            )
        if template_id not in self.templates:
            raise HostError(
                f"template {template_id!r} is not on this node and its capture is not in "
                "the snapshot repository (an in-memory host has none)",
                code="unavailable",
            )

    async def create(self, sandbox_id: str, template_id: str, guest: GuestConfig) -> None:
        if sandbox_id in self.live:
            return
        if self.free <= 0:
            raise HostError("node is full")
        await self.hold_template(template_id)
        await self._started("create")
        self.live[sandbox_id] = _Sandbox(template_id, guest)

    def started_warm(self, sandbox_id: str) -> bool:
        return False  # records have no VMs to keep warm

    def start_warm_pool(self, spare_mib: Callable[[], int]) -> None:
        return None

    def warm_stats(self) -> WarmStats:
        return WarmStats()

    def held_templates(self) -> tuple[str, ...]:
        # `no_room_for` too: a capture held whose disks under it were evicted is fetched
        return tuple(sorted(self.templates))

    def ram_pool_stats(self) -> RamPoolStats:
        return RamPoolStats()  # no RAM files

    async def flush_guest(self, sandbox_id: str) -> dict[str, object]:
        if sandbox_id not in self.live:
            raise HostError(f"sandbox {sandbox_id} is not running on this node")
        return {}

    async def pause(
        self,
        sandbox_id: str,
        *,
        keep_memory: bool = True,
        guest_defaults: dict[str, object] | None = None,
    ) -> Capture:
        box = self.live.pop(sandbox_id, None)
        if box is None:
            if sandbox_id in self.paused:
                held = self.paused[sandbox_id]
                return Capture(held.capture or "", held.template_id, 0)
            raise HostError(f"sandbox {sandbox_id} is not running on this node")
        await self._work()
        box.capture = f"{sandbox_id}-p{uuid.uuid4().hex[:8]}"
        self.paused[sandbox_id] = box
        self._gone(sandbox_id)
        return Capture(box.capture, box.template_id, 0, memory=keep_memory)

    async def resume(self, sandbox_id: str) -> str:
        if sandbox_id in self.live:
            return self.live[sandbox_id].template_id
        box = self.paused.pop(sandbox_id, None)
        if box is None:
            raise HostError(f"sandbox {sandbox_id} has no paused state on this node")
        await self._started("resume")
        if box.capture is not None:
            self.resumed_from[sandbox_id] = box.capture
        box.capture = None
        self.live[sandbox_id] = box
        return box.template_id

    async def reconfigure(self, sandbox_id: str, guest: GuestConfig) -> None:
        live = self.live.get(sandbox_id)
        if live is None or live.capture is not None:
            raise HostError(f"sandbox {sandbox_id} is not running on this node")
        live.guest = dataclasses.replace(live.guest, egress=guest.egress)

    def resume_recorded(self, sandbox_id: str) -> None:
        self.resumed_from.pop(sandbox_id, None)

    async def undo_resume(self, sandbox_id: str) -> bool:
        capture, box = self.resumed_from.pop(sandbox_id, None), self.live.pop(sandbox_id, None)
        if box is not None:
            self._gone(sandbox_id)
        if capture is None or box is None:
            return False
        box.capture = capture
        self.paused[sandbox_id] = box
        return True

    def running_ids(self) -> list[str]:
        return list(self.live)

    async def guest_metrics(self, sandbox_id: str) -> dict[str, Any] | None:
        return None  # no guest, nothing measured

    def console_log(self, sandbox_id: str) -> tuple[Path, int] | None:
        return None

    async def take_over_paused(
        self, sandbox_id: str, template_id: str, snapshot_id: str, guest: GuestConfig, claim: Claim
    ) -> None:
        raise HostError(
            f"the capture of {sandbox_id} is on another node: an in-memory host "
            "has no snapshot repository"
        )

    async def fork(self, parent_id: str, children: dict[str, GuestConfig]) -> dict[str, str | None]:
        parent = self.live.get(parent_id)
        if parent is None:
            raise HostError(f"sandbox {parent_id} is not running on this node")
        if self.free < len(children):
            raise HostError(f"node has room for {self.free} more sandboxes, not {len(children)}")
        await self._started("fork")
        for cid, guest in children.items():
            self.live[cid] = _Sandbox(parent.template_id, guest)
        return dict.fromkeys(children)

    async def snapshot(self, sandbox_id: str, name: str) -> Capture:
        box = self.live.get(sandbox_id)
        if box is None:
            raise HostError(f"sandbox {sandbox_id} is not running on this node")
        await self._work()
        self.templates.add(name)
        return Capture(f"snap-{uuid.uuid4().hex[:12]}", box.template_id, 0)

    async def kill(self, sandbox_id: str) -> bool:
        self.resumed_from.pop(sandbox_id, None)
        paused = self.paused.pop(sandbox_id, None)
        live = self.live.pop(sandbox_id, None)
        if live is not None:
            self._gone(sandbox_id)
        return live is not None or paused is not None

    def _gone(self, sandbox_id: str) -> None:
        for hook in self._hooks:
            try:
                hook(sandbox_id)
            except Exception:
                log.exception("on_gone hook failed for %s", sandbox_id)

    def adopt_paused(
        self,
        sandbox_id: str,
        template_id: str,
        snapshot_id: str,
        guest: GuestConfig,
        *,
        durable: bool,
    ) -> bool:
        return False  # nothing of a paused sandbox survives this host's process

    async def sweep_leftovers(self) -> int:
        return 0  # records leave nothing on disk

    def drop_capture(self, snapshot_id: str) -> None:
        return None

    def reload_templates(self) -> int:
        return 0

    async def import_image(
        self,
        name: str,
        source: ImageSource,
        *,
        vcpus: int,
        mem_mib: int,
        progress: Callable[[str], None] | None = None,
    ) -> ImportedImage:
        """Checks what it can without converting: a local layout must be one, a registry
        reference must parse (nothing is pulled)."""
        if source.ref is not None:
            try:
                ref = str(parse_reference(source.ref))
            except ImageError as e:
                raise HostError(str(e)) from e
            digest = hashlib.sha256(ref.encode()).hexdigest()
        else:
            path = Path(source.path or "")
            if not (path / "oci-layout").is_file() and not (
                path.is_file() and path.suffix == ".tar"
            ):
                raise HostError(f"{path}: not an OCI image layout (no oci-layout file) or archive")
            digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()
        await self._work()
        self.templates.add(name)
        # a disk the size of `base`'s: sandboxes of the template are created with it (0
        # would be refused), as a converted image's would be
        return ImportedImage(digest, 2048)

    async def forget_template(self, name: str) -> None:
        if name != "base":
            self.templates.discard(name)

    def collect_soon(self) -> None:
        return None

    async def close(self) -> None:
        for sid in list(self.live):
            await self.kill(sid)
