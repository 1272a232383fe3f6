"""Template snapshots: a template is booted once until envd answers, then captured.

Every sandbox of a template restores that capture, which is the fast path all latency
goals are about. Captures are keyed by the image digest and the machine fingerprint, so a
new envd, image or QEMU never restores a stale snapshot: it builds a fresh one.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workers.node.disk.budget import NoRoom
from workers.node.image import GuestImage, build_base, kernel_cmdline
from workers.node.image.build import guest_defaults
from workers.node.image.disk import DEFAULT_FREE
from workers.node.runtime import Runtime, Snapshot
from workers.node.runtime.guest import http_request, wait_and_init
from workers.node.runtime.memfile import punch_zero_pages

# A service's start in an emulated (TCG) guest: the code interpreter's kernel imports
# IPython, numpy, pandas and matplotlib before it listens (~1-3 min under TCG).
READY_TIMEOUT_S = 900.0
#: At most this much of a template's name goes into its capture's id (128 characters in
#: all: `tpl-`, the name, two 16-character digests)
_NAME_IN_ID = 64

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


class TemplateError(Exception):
    """A template is unknown or could not be built."""


class TemplateNotLocal(TemplateError):
    """A snapshot template whose capture is gone from this disk but was uploaded: the host
    pulls it from the snapshot repository (`key`) and adopts it again."""

    def __init__(self, name: str, key: str, directory: Path, base_image: Path) -> None:
        super().__init__(f"template {name!r} must be pulled from the repository")
        self.name, self.key, self.directory, self.base_image = name, key, directory, base_image


@dataclass(frozen=True)
class TemplateSpec:
    """Shape of a template's VMs; fixed at build time (a snapshot cannot change them)."""

    name: str
    vcpus: int = 1
    mem_mib: int = 512
    #: A guest port whose `GET /health` must answer 200 before the capture (a server the
    #: image starts at boot, e.g. the code interpreter's 49999, with its kernel up).
    ready_port: int | None = None


class TemplateCatalog:
    """Resolves a template name to its captured snapshot, building it on first use."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        progress: Progress | None = None,
        base: TemplateSpec | None = None,
        free_bytes: int = DEFAULT_FREE,
    ) -> None:
        self.runtime = runtime
        self.progress = progress or (lambda m: log.info("template: %s", m))
        #: free space this node's image root disks keep (`NodeSettings.image_free_bytes`)
        self.free_bytes = free_bytes
        self._specs: dict[str, TemplateSpec] = {"base": base or TemplateSpec("base")}
        self._images: dict[str, Callable[[], GuestImage]] = {
            "base": lambda: build_base(progress=self.progress, free_bytes=free_bytes)
        }
        self._ready: dict[str, Snapshot] = {}
        self._records = runtime.state_dir / "snapshot-templates"
        self._tokens: dict[str, str | None] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def known(self) -> list[str]:
        return sorted(self._specs)

    def mem_mib(self, name: str) -> int | None:
        """The RAM of `name`'s VMs, if this node knows the template."""
        spec = self._specs.get(name)
        return spec.mem_mib if spec is not None else None

    def held(self) -> tuple[str, ...]:
        """The templates whose capture is on this disk now (built, taken or fetched)."""
        return tuple(sorted(self._ready))

    def ready(self, name: str) -> Snapshot | None:
        """`name`'s capture if it is on this disk now (nothing is built or pulled)."""
        return self._ready.get(name)

    def guest_token(self, name: str) -> str | None:
        """The envd access token the captured guest holds (a snapshot of a secure sandbox):
        a restore must present it to re-initialise envd with the new sandbox's own."""
        return self._tokens.get(name)

    def adopt(
        self,
        name: str,
        snap: Snapshot,
        guest_token: str | None = None,
        source: str | None = None,
    ) -> None:
        """A capture of a running sandbox (`source`) becomes a template (E2B's persistent
        snapshots): new sandboxes of `name` restore it. Recorded on disk so a node restart
        keeps it."""
        self._specs[name] = TemplateSpec(name, snap.machine.vcpus, snap.machine.mem_mib)
        self._images.pop(name, None)
        self._ready[name] = snap
        self._tokens[name] = guest_token
        self._write_record(
            name,
            {
                "name": name,
                "snapshot": str(snap.dir),
                "guest_token": guest_token,
                "source": source,
                "base_image": str(snap.base_image),
            },
        )

    def builds(self, name: str) -> bool:
        """A template this node builds from an image of its own (nothing to fetch for it
        from the repository: its first create boots it)."""
        return name in self._images

    def knows(self, name: str) -> bool:
        """A template this node builds or took (its capture may still have to be pulled)."""
        return name in self._specs or self._read_record(name) is not None

    def source_of(self, name: str) -> str | None:
        """The sandbox a snapshot template was taken of, if recorded."""
        doc = self._read_record(name)
        source = doc.get("source") if doc else None
        return source if isinstance(source, str) else None

    def mark_uploaded(self, name: str, snap: Snapshot) -> bool:
        """The repository holds `snap` as `name`'s capture: should this disk lose it, it is
        pulled back. False if `name` moved on to another capture meanwhile."""
        doc = self._read_record(name)
        if doc is None or doc.get("snapshot") != str(snap.dir):
            return False
        self._write_record(name, {**doc, "uploaded": snap.snapshot_id})
        return True

    def uploaded_id(self, name: str, snap: Snapshot) -> str | None:
        """The repository's id of `snap` if it is `name`'s capture and uploaded (the disk
        budget evicts only those: pulled back on the next create, `_missing`)."""
        doc = self._read_record(name)
        if doc is None or doc.get("snapshot") != str(snap.dir) or not doc.get("uploaded"):
            return None
        return str(doc["uploaded"])

    def evict(self, name: str, snap: Snapshot) -> bool:
        """Let go of `name`'s capture on this disk, keeping its record: the next create
        pulls it back (`TemplateNotLocal`). False if it was not uploaded, or moved on."""
        if self.uploaded_id(name, snap) is None or self._ready.get(name) is not snap:
            return False
        del self._ready[name]
        return True

    def _read_record(self, name: str) -> dict[str, Any] | None:
        """The on-disk record of snapshot template `name`, or None (none, or unreadable)."""
        try:
            doc: dict[str, Any] = json.loads((self._records / f"{_safe(name)}.json").read_text())
        except (OSError, ValueError):
            return None
        return doc

    def _write_record(self, name: str, doc: dict[str, object]) -> None:
        record = self._records / f"{_safe(name)}.json"
        record.parent.mkdir(parents=True, exist_ok=True)
        tmp = record.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # holds a token
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)
        tmp.replace(record)

    def forget(self, name: str) -> Snapshot | None:
        """Drop a snapshot template (its capture is returned for the caller to delete)."""
        self._specs.pop(name, None)
        self._tokens.pop(name, None)
        (self._records / f"{_safe(name)}.json").unlink(missing_ok=True)
        return self._ready.pop(name, None)

    def reload(self) -> int:
        """Re-adopt snapshot templates recorded before a restart; returns how many. One
        whose capture is gone stays known if it was uploaded (pulled on first use)."""
        n = 0
        for record in sorted(self._records.glob("*.json")):
            doc = json.loads(record.read_text())
            sdir = Path(doc["snapshot"])
            if (sdir / "manifest.json").exists():
                snap = Snapshot.read(sdir)
                self._specs[doc["name"]] = TemplateSpec(
                    doc["name"], snap.machine.vcpus, snap.machine.mem_mib
                )
                self._ready[doc["name"]] = snap
                self._tokens[doc["name"]] = doc.get("guest_token")
                n += 1
            elif doc.get("uploaded"):
                self._specs[doc["name"]] = TemplateSpec(doc["name"])
                self._tokens[doc["name"]] = doc.get("guest_token")
                n += 1
        return n

    def capture_dirs(self) -> set[Path]:
        """Directories a template needs: built captures and every recorded one."""
        dirs = {snap.dir for snap in self._ready.values()}
        for record in self._records.glob("*.json"):
            try:
                dirs.add(Path(json.loads(record.read_text())["snapshot"]))
            except (ValueError, KeyError):
                continue
        return dirs

    def _missing(self, name: str) -> TemplateNotLocal | None:
        """Why a snapshot template cannot restore from this disk (and where to pull it)."""
        snap = self._ready.get(name)
        if snap is not None and all(
            p.exists() for p in (snap.dir / "manifest.json", snap.mem, snap.state, snap.disk_top)
        ):
            return None
        doc = self._read_record(name)
        if doc is None or not doc.get("uploaded") or "base_image" not in doc:
            return None
        return TemplateNotLocal(
            name, doc["uploaded"], Path(doc["snapshot"]), Path(doc["base_image"])
        )

    def capture_of(self, name: str) -> Snapshot | None:
        """The local capture of snapshot template `name` (None: not a snapshot template of
        this node, or not on this disk)."""
        if self._read_record(name) is None:
            return None
        return self._ready.get(name)

    def captures(self) -> list[Snapshot]:
        """Template captures built so far (their layers are shared by every sandbox)."""
        return list(self._ready.values())

    def register(self, spec: TemplateSpec, image: Callable[[], GuestImage]) -> None:
        self._specs[spec.name] = spec
        self._images[spec.name] = image
        self._ready.pop(spec.name, None)

    async def get(self, name: str) -> Snapshot:
        if name not in self._images:  # a snapshot template: its capture must be here
            missing = self._missing(name)
            if missing is not None:
                raise missing
        if name in self._ready:
            return self._ready[name]
        if name not in self._specs or name not in self._images:
            raise TemplateError(f"template {name!r} not found on this node")
        async with self._locks.setdefault(name, asyncio.Lock()):
            if name not in self._ready:
                try:
                    self._ready[name] = await self._build(self._specs[name])
                except NoRoom as e:  # `unavailable`: placement may build it elsewhere
                    raise NoRoom(f"template {name!r} could not be built: {e}") from e
        return self._ready[name]

    async def _build(self, spec: TemplateSpec) -> Snapshot:
        image = await asyncio.to_thread(self._images[spec.name])
        machine = self.runtime.machine(vcpus=spec.vcpus, mem_mib=spec.mem_mib)
        snap_id = capture_id(spec.name, image.digest, machine.fingerprint())
        sdir = self.runtime.snapshot_dir(snap_id)
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
        if spec.ready_port is not None:
            # first: the service's start (a kernel importing numpy, pandas, matplotlib)
            # keeps an emulated guest's CPU busy; envd's /init then took over 2 s
            self.progress(f"{spec.name}: waiting for port {spec.ready_port}")
            try:
                waited = await wait_port_ready(vm.host, spec.ready_port, timeout=READY_TIMEOUT_S)
            except BaseException:
                await self.runtime.destroy(vm)
                raise
            self.progress(f"{spec.name}: port {spec.ready_port} ready after {waited:.1f}s")
        # One /init before the capture: envd imports what /init needs lazily, and under TCG
        # those imports would otherwise be paid by every sandbox's first request. It also
        # sets the image's ENV, USER and WORKDIR as the template's defaults (OCI images).
        await wait_and_init(vm.host, guest_defaults(image), timeout=60.0)
        self.progress(f"{spec.name}: envd answered after {took:.1f}s; capturing")
        if sdir.exists():  # a half-written capture from a crash: start over
            self.runtime.remove_capture_dir(sdir)
        try:  # a build may be refused for disk (`NoRoom`, unavailable): the VM goes
            async with self.runtime.capturing(vm, refuse=True):
                snap = await self.runtime.capture(vm, resume=False, snapshot_id=snap_id)
        except BaseException:
            if vm.vm_id in self.runtime.vms:
                await self.runtime.destroy(vm)
            raise
        await asyncio.to_thread(_zero_pages_as_holes, snap)
        return snap


def _zero_pages_as_holes(snap: Snapshot) -> None:
    """The capture's RAM file without its zero pages (`punch_zero_pages`): before any VM
    restores from it, so every copy of it is smaller too. Nobody writes a template's
    capture. A failure keeps the file as it is: the same bytes, only larger."""
    if snap.ram_in_state:  # the RAM is in the state stream; `mem` is a placeholder
        return
    try:
        freed = punch_zero_pages(snap.mem)
    except OSError as e:
        log.warning("%s: zero pages of its RAM file kept: %s", snap.snapshot_id, e)
        return
    log.info("%s: %d MiB of zero pages in its RAM file made holes", snap.snapshot_id, freed >> 20)


async def wait_port_ready(host: str, port: int, *, timeout: float) -> float:
    """Poll `GET /health` on a guest port until it answers 200; seconds waited."""
    start = time.monotonic()
    last: object = None
    while time.monotonic() - start < timeout:
        try:
            status, _ = await http_request(host, port, "GET", "/health", timeout=5.0)
            if status == 200:
                return time.monotonic() - start
            last = status
        except (OSError, TimeoutError, ConnectionError) as e:
            last = e
        await asyncio.sleep(0.5)
    raise TemplateError(f"port {port} of the template's guest not ready in {timeout:.0f}s ({last})")


def capture_id(name: str, image_digest: str, fingerprint: str) -> str:
    """The id of template `name`'s capture of an image: also its key in the snapshot
    repository once uploaded (an import is, like a snapshot), so it keeps to the keys'
    alphabet and length (`workers.snapshot.paths`): a build's `name:<build id>` made safe,
    a long name cut and told apart by its hash."""
    safe = _safe(name)
    if len(safe) > _NAME_IN_ID:
        safe = f"{safe[: _NAME_IN_ID - 13]}-{hashlib.sha256(name.encode()).hexdigest()[:12]}"
    return f"tpl-{safe}-{image_digest[:16]}-{fingerprint}"


def _safe(name: str) -> str:
    """A file name for any template name (snapshot names may carry ':' and '/')."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
