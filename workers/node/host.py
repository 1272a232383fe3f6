"""The sandboxes living on this node: each a microVM restored from its template.

No bus in here: `SandboxHost` is what the node worker's handlers call after the domain has
decided, and what the API's proxy asks "where does this sandbox answer?". It keeps the
sandbox → VM map and the little per-sandbox state the guest needs again after a restore
(env vars, access token).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from workers.node.image.cache import cache_root
from workers.node.net import EgressPolicy
from workers.node.ports import CaptureRepository
from workers.node.runtime import Runtime, Snapshot, Vm, allocated_bytes, wait_and_init
from workers.node.templates import TemplateCatalog, TemplateError, TemplateNotLocal

log = logging.getLogger(__name__)

#: A snapshot template's capture in the repository: (key, guest token, source sandbox id).
TemplateLocation = tuple[str, str | None, str]


class HostError(Exception):
    """A sandbox operation on this node failed; the message is safe to show a user."""


@dataclass(frozen=True)
class GuestConfig:
    """What envd in a sandbox is told at every (re)start via /init."""

    env_vars: dict[str, str] = field(default_factory=dict)
    access_token: str | None = None
    egress: EgressPolicy = field(default_factory=EgressPolicy)

    def init_body(self, sandbox_id: str) -> dict[str, object]:
        """No `defaultUser`/`defaultWorkdir`: the restored guest keeps the ones it was
        captured with — envd's own (`user`, its home) for `base`, a built template's USER
        and WORKDIR for that template. `envVars` merge over the captured ones (a built
        template's ENV), so the sandbox's own values win."""
        return {
            "envVars": self.env_vars,
            "accessToken": self.access_token,
            "hostname": sandbox_id[:63],
        }


@dataclass
class LiveSandbox:
    sandbox_id: str
    template_id: str
    vm: Vm
    guest: GuestConfig


@dataclass
class PausedSandbox:
    """A paused sandbox: its capture on this node's disk, and what its guest must be told."""

    sandbox_id: str
    template_id: str
    snapshot: Snapshot
    guest: GuestConfig


class SandboxHost:
    """Creates, kills and locates this node's sandboxes."""

    def __init__(
        self,
        runtime: Runtime,
        templates: TemplateCatalog,
        *,
        capacity: int,
        repository: CaptureRepository | None = None,
    ) -> None:
        self.runtime = runtime
        #: where captures become durable (S3 or a shared filesystem); None: node-local only
        self.repository = repository
        self.templates = templates
        self.capacity = capacity
        self.sandboxes: dict[str, LiveSandbox] = {}
        self.paused: dict[str, PausedSandbox] = {}
        #: called with a sandbox id when its VM goes away (kill, pause): e.g. the proxy
        #: ends streams into it
        self.on_gone: list[Callable[[str], None]] = []
        self._gc_lock = asyncio.Lock()
        self._busy: dict[str, asyncio.Lock] = {}
        #: captures made for forks: their RAM file is mapped by the running children, so
        #: each is kept until none of its children runs any more (see `collect_garbage`)
        self._fork_captures: list[Snapshot] = []
        self._pulls: dict[str, asyncio.Lock] = {}
        #: where a template this node never had is durable: (repository key, the token its
        #: captured guest holds, the sandbox it was taken of), or None — the log knows (set
        #: by the node worker)
        self.locate_template: Callable[[str], Awaitable[TemplateLocation | None]] | None = None

    @property
    def free(self) -> int:
        return max(0, self.capacity - len(self.sandboxes))

    def lock(self, sandbox_id: str) -> asyncio.Lock:
        """Serialises operations on one sandbox (a kill waits for a create to finish)."""
        return self._busy.setdefault(sandbox_id, asyncio.Lock())

    def upstream(self, sandbox_id: str) -> str | None:
        """The address that reaches this sandbox's guest ports, if it runs here."""
        live = self.sandboxes.get(sandbox_id)
        return live.vm.host if live and live.vm.qemu.alive else None

    async def create(self, sandbox_id: str, template_id: str, guest: GuestConfig) -> LiveSandbox:
        """Restore the template into a new VM; returns once envd in it has been initialised.

        Idempotent: a redelivered create for a sandbox already running here returns it.
        """
        if sandbox_id in self.sandboxes:
            return self.sandboxes[sandbox_id]
        if self.free <= 0:
            raise HostError("node is full")
        try:
            snap = await self.template(template_id)
            vm, timing = await self.runtime.restore(
                snap,
                vm_id=sandbox_id,
                private_memory=False,  # a sandbox can be paused: its RAM must be its own file
                policy=guest.egress,
                init=guest.init_body(sandbox_id),
                init_token=self.templates.guest_token(template_id),
            )
        except HostError:
            raise
        except Exception as e:
            log.exception("create %s failed", sandbox_id)
            raise HostError(f"sandbox {sandbox_id} failed to start: {e}") from e
        log.info(
            "sandbox %s up: running %.1f ms, envd %.1f ms",
            sandbox_id,
            timing.running * 1000,
            timing.envd * 1000,
        )
        live = LiveSandbox(sandbox_id, template_id, vm, guest)
        self.sandboxes[sandbox_id] = live
        return live

    async def pause(self, sandbox_id: str) -> PausedSandbox:
        """Capture the VM and release it: no process, no slot, no host RAM while paused.

        The cost is stop + device state (~10 ms) whatever the guest's RAM size: the RAM
        already lives in the sandbox's own file, which simply stays on disk.
        """
        live = self.sandboxes.get(sandbox_id)
        if live is None:
            if sandbox_id in self.paused:
                return self.paused[sandbox_id]
            raise HostError(f"sandbox {sandbox_id} is not running on this node")
        snap_id = f"{sandbox_id}-p{uuid.uuid4().hex[:8]}"
        try:
            snap = await self.runtime.capture(
                live.vm, resume=False, snapshot_id=snap_id, detach=True
            )
            snap = await self.runtime.compact_if_deep(snap)
        except Exception as e:
            log.exception("pause %s failed", sandbox_id)
            raise HostError(f"sandbox {sandbox_id} could not be paused: {e}") from e
        del self.sandboxes[sandbox_id]
        self._gone(sandbox_id)
        paused = PausedSandbox(sandbox_id, live.template_id, snap, live.guest)
        self.paused[sandbox_id] = paused
        return paused

    async def template(self, name: str) -> Snapshot:
        """A template's capture, pulled back from the repository first if this disk lost
        it (a persistent snapshot is durable once uploaded: `upload_template`), or taken
        over from there if it was taken on another node."""
        try:
            return await self.templates.get(name)
        except TemplateNotLocal as gone:
            return await self._pull_template(name, gone)
        except TemplateError:
            if self.templates.knows(name):  # ours, and it failed: say why
                raise
            return await self._take_over_template(name)

    async def _pull_template(self, name: str, gone: TemplateNotLocal) -> Snapshot:
        if self.repository is None:
            raise HostError(f"the capture of template {name!r} is gone and no "
                            "repository is set") from gone  # fmt: skip
        async with self._pulls.setdefault(name, asyncio.Lock()):
            try:
                return await self.templates.get(name)  # another create pulled it
            except TemplateNotLocal:
                pass
            snap = await self._fetch(gone.key, gone.directory, gone.base_image,
                                     f"template {name!r}")  # fmt: skip
            self.templates.adopt(name, snap, self.templates.guest_token(name),
                                 self.templates.source_of(name))  # fmt: skip
            self.templates.mark_uploaded(name, snap)
            return snap

    async def _take_over_template(self, name: str) -> Snapshot:
        """A snapshot template taken on another node (gone now): pull its durable capture
        from the repository over this node's copy of the base image, and keep it as a
        template of this node from then on."""
        where = await self.locate_template(name) if self.locate_template else None
        if where is None or self.repository is None:
            raise HostError(f"template {name!r} is not on this node and its capture is not in "
                            "the snapshot repository")  # fmt: skip
        key, token, source = where
        async with self._pulls.setdefault(name, asyncio.Lock()):
            try:
                return await self.templates.get(name)  # another create pulled it meanwhile
            except TemplateError:
                pass
            snap = await self._fetch_foreign(key, f"the capture of template {name!r}")
            self.templates.adopt(name, snap, token, source)
            self.templates.mark_uploaded(name, snap)
            return snap

    async def upload_template(self, name: str, snap: Snapshot) -> bool:
        """Make a persistent snapshot durable; False if there is no repository or `name`
        has moved on to a newer capture (nothing left to do)."""
        if self.repository is None:
            return False
        await self._store(snap)
        return self.templates.mark_uploaded(name, snap)

    async def _pull(self, paused: PausedSandbox) -> PausedSandbox:
        """The local capture is gone (cache evicted, disk replaced): fetch it back from the
        snapshot repository. Never a half-restored VM: the download completes first."""
        snap = paused.snapshot
        if self.repository is None:
            raise HostError(f"the capture of {paused.sandbox_id} is gone and no repository is set")
        fetched = await self._fetch(snap.snapshot_id, snap.dir, snap.base_image,
                                    f"the capture of {paused.sandbox_id}")  # fmt: skip
        pulled = dataclasses.replace(paused, snapshot=fetched)
        self.paused[paused.sandbox_id] = pulled
        return pulled

    async def pull_paused(
        self, sandbox_id: str, template_id: str, snapshot_id: str, guest: GuestConfig
    ) -> None:
        """Take over a paused sandbox whose node is gone: its capture comes from the
        repository (then `resume` it as any other). The disk chain is rebuilt over this
        node's copy of the same base image."""
        if self.repository is None:
            raise HostError(f"sandbox {sandbox_id} is paused on another node and no "
                            "repository is set")  # fmt: skip
        snap = await self._fetch_foreign(snapshot_id, f"the capture of {sandbox_id}")
        self.paused[sandbox_id] = PausedSandbox(sandbox_id, template_id, snap, guest)

    async def _fetch_foreign(self, key: str, what: str) -> Snapshot:
        """A capture another node took, from the repository into this node's snapshot
        directory, its disk chain rebuilt over this node's copy of the same base image."""
        assert self.repository is not None
        try:
            manifest = await self.repository.get_manifest(key)
        except Exception as e:
            raise HostError(f"{what} is not in the repository: {e}") from e
        base = self._base_image(manifest.base_image.digest)
        return await self._fetch(key, self.runtime.snapshot_dir(key), base, what)

    def _base_image(self, digest: str) -> Path:
        """This node's copy of a base image, by the digest a capture names (its directory in
        the image cache, as the uploading node had it)."""
        candidates = [c.base_image for c in self.templates.captures()]
        candidates.append(cache_root() / digest / "root.ext4")
        for path in candidates:
            if path.parent.name == digest and path.is_file():
                return path
        raise HostError(f"base image {digest[:12]} is not on this node (build the same image "
                        "here: `python -m workers.node.image build-base`)")  # fmt: skip

    async def upload(self, sandbox_id: str, snap: Snapshot) -> int | None:
        """Make a capture durable in the repository; its size in bytes, None without one."""
        if self.repository is None:
            return None
        await self.runtime.settled(snap.snapshot_id)
        await self._store(snap)
        return sum(allocated_bytes(p) for p in (snap.mem, snap.state, snap.disk_top))

    async def _store(self, snap: Snapshot) -> None:
        """One capture into the repository, under its own snapshot id (content-addressed:
        blobs already there are not sent again)."""
        assert self.repository is not None
        result = await self.repository.upload(
            snap.dir, base_image_digest=snap.base_image.parent.name, snapshot_id=snap.snapshot_id
        )
        log.info("uploaded %s: %d blobs, %d bytes new", snap.snapshot_id,
                 result.blobs_uploaded, result.bytes_uploaded)  # fmt: skip

    async def _fetch(self, key: str, directory: Path, base_image: Path, what: str) -> Snapshot:
        """Rebuild a capture from the repository in `directory`; the download completes
        before anything restores from it (never a half-restored VM)."""
        assert self.repository is not None
        try:
            # layers into the node's layer store: the restored VM runs on them after this
            # directory is deleted, and a later pause freezes a chain that still needs them
            local = await self.repository.download(key, directory, base_image,
                                                   layers_dir=self.runtime.layers.root)  # fmt: skip
        except Exception as e:
            log.exception("pulling %s failed", key)
            raise HostError(f"{what} could not be fetched: {e}") from e
        log.info("pulled %s from the repository (%d blobs, %d bytes)", key,
                 local.blobs_fetched, local.bytes_fetched)  # fmt: skip
        return Snapshot.read(local.dir)

    def adopt_paused(
        self, sandbox_id: str, template_id: str, snapshot_dir: Path, guest: GuestConfig
    ) -> None:
        """Take back a paused sandbox whose capture survived a node restart."""
        snap = Snapshot.read(snapshot_dir)
        self.paused[sandbox_id] = PausedSandbox(sandbox_id, template_id, snap, guest)

    async def resume(self, sandbox_id: str) -> LiveSandbox:
        """Restore a paused sandbox from its own capture; processes and memory intact."""
        if sandbox_id in self.sandboxes:
            return self.sandboxes[sandbox_id]
        paused = self.paused.get(sandbox_id)
        if paused is None:
            raise HostError(f"sandbox {sandbox_id} has no paused state on this node")
        if not (paused.snapshot.dir / "manifest.json").exists():
            paused = await self._pull(paused)
        try:
            vm, timing = await self.runtime.restore(
                paused.snapshot,
                vm_id=sandbox_id,
                private_memory=False,
                adopt_memory=True,
                policy=paused.guest.egress,
                init=paused.guest.init_body(sandbox_id),
                init_token=paused.guest.access_token,
            )
        except Exception as e:
            log.exception("resume %s failed", sandbox_id)
            raise HostError(f"sandbox {sandbox_id} could not be resumed: {e}") from e
        log.info("sandbox %s resumed: running %.1f ms, envd %.1f ms", sandbox_id,
                 timing.running * 1000, timing.envd * 1000)  # fmt: skip
        del self.paused[sandbox_id]
        self.runtime.delete_snapshot(paused.snapshot)
        live = LiveSandbox(sandbox_id, paused.template_id, vm, paused.guest)
        self.sandboxes[sandbox_id] = live
        return live

    async def fork(self, parent_id: str, children: dict[str, GuestConfig]) -> dict[str, str | None]:
        """Children of a running sandbox, each with its own id and guest config (token);
        returns child id → error (None when it runs). The parent keeps running."""
        parent = self.sandboxes.get(parent_id)
        if parent is None:
            raise HostError(f"sandbox {parent_id} is not running on this node")
        if self.free < len(children):
            raise HostError(f"node has room for {self.free} more sandboxes, not {len(children)}")
        ids = list(children)
        try:
            capture, vms = await self.runtime.fork(
                parent.vm, len(ids), wait=False, vm_ids=ids, policy=parent.guest.egress
            )
        except Exception as e:
            log.exception("fork of %s failed", parent_id)
            raise HostError(f"sandbox {parent_id} could not be captured for a fork: {e}") from e
        # The capture stays on disk while children map its RAM file copy-on-write (a child's
        # pause copies what it needs); `collect_garbage` deletes it after the last child.
        self._fork_captures.append(capture)
        log.info("sandbox %s fork into %d: paused %.1f ms", parent_id, len(ids), capture.stopped_ms)

        async def init(cid: str, vm: Vm | BaseException) -> str | None:
            if isinstance(vm, BaseException):
                return f"child failed to start: {vm}"
            guest = children[cid]
            try:
                await wait_and_init(vm.host, guest.init_body(cid),
                                    token=parent.guest.access_token, timeout=60)  # fmt: skip
            except Exception as e:
                await self.runtime.destroy(vm)
                return f"child envd did not initialise: {e}"
            self.sandboxes[cid] = LiveSandbox(cid, parent.template_id, vm, guest)
            return None

        errors = await asyncio.gather(*(init(c, v) for c, v in zip(ids, vms, strict=True)))
        return dict(zip(ids, errors, strict=True))

    async def snapshot(self, sandbox_id: str, name: str) -> Snapshot:
        """A persistent snapshot of a running sandbox, which keeps running (brief pause);
        it becomes template `name` on this node."""
        live = self.sandboxes.get(sandbox_id)
        if live is None:
            raise HostError(f"sandbox {sandbox_id} is not running on this node")
        snap_id = f"snap-{uuid.uuid4().hex[:12]}"
        try:
            snap = await self.runtime.capture(live.vm, resume=True, snapshot_id=snap_id)
            t0 = time.monotonic()
            # the sandbox runs again; its RAM copy goes to disk before the template exists
            await self.runtime.persist(snap)
            snap = await self.runtime.compact_if_deep(snap)
            log.info("sandbox %s snapshot %s: paused %.1f ms, on disk %.1f ms later", sandbox_id,
                     name, snap.stopped_ms, (time.monotonic() - t0) * 1000)  # fmt: skip
        except Exception as e:
            log.exception("snapshot of %s failed", sandbox_id)
            raise HostError(f"sandbox {sandbox_id} could not be snapshotted: {e}") from e
        old = self.templates.forget(name)
        self.templates.adopt(name, snap, live.guest.access_token, sandbox_id)
        if old is not None:  # a new build of an existing name replaces the old capture
            self.runtime.delete_snapshot(old)
        return snap

    async def kill(self, sandbox_id: str) -> bool:
        """Destroy the sandbox's VM or paused capture; False if neither was here."""
        paused = self.paused.pop(sandbox_id, None)
        if paused is not None:
            self.runtime.delete_snapshot(paused.snapshot)
        live = self.sandboxes.pop(sandbox_id, None)
        if live is None:
            return paused is not None
        await self.runtime.destroy(live.vm)
        self._gone(sandbox_id)
        return True

    def _gone(self, sandbox_id: str) -> None:
        for hook in self.on_gone:
            try:
                hook(sandbox_id)
            except Exception:  # a listener's failure must not fail the kill
                log.exception("on_gone hook failed for %s", sandbox_id)

    async def collect_garbage(self) -> int:
        """Free disk layers nothing needs any more (killed sandboxes, compacted chains).
        Roots: live VMs (the runtime knows them), paused captures and template captures."""
        async with self._gc_lock:
            self._drop_unmapped_fork_captures()
            keep = [p.snapshot for p in self.paused.values()] + self.templates.captures()
            return await self.runtime.collect_layers(keep)

    def _drop_unmapped_fork_captures(self) -> None:
        """A fork capture's own files (RAM, device state) go once no running VM maps its
        RAM; its disk layer stays as long as a child's chain stacks on it (layer GC)."""
        mapped = {vm.mem_file for vm in self.runtime.vms.values()}
        for capture in list(self._fork_captures):
            if capture.mem not in mapped:
                self.runtime.delete_snapshot(capture)
                self._fork_captures.remove(capture)
                log.info("fork capture %s freed: no child maps it", capture.snapshot_id)

    async def close(self) -> None:
        for sid in list(self.sandboxes):
            await self.kill(sid)
