"""The node's ports.

`Host` is the line between the node worker (commands in, events out) and the machines that
run sandboxes: `SandboxHost` (QEMU microVMs, `workers/node/host.py`), or `MemoryHost`
(`workers/node/memory.py`: the VM-less tier, the fleet simulator). The worker calls these
after the domain has decided; it never reaches into VMs, disks or templates itself.

`CaptureRepository`: the snapshot repository as the host pulls captures back (rule 4).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from workers.node.errors import HostError
from workers.node.net.firewall import EgressPolicy
from workers.node.vmm.spec import VOLUME_SERIAL

__all__ = [
    "Accelerator",
    "Capture",
    "CaptureRepository",
    "Claim",
    "Died",
    "Fetched",
    "GuestConfig",
    "GuestVolume",
    "Host",
    "HostError",
    "ImageSource",
    "ImportedImage",
    "LocalVolumes",
    "Manifest",
    "Stage",
    "TemplateLocation",
    "TemplateLocator",
    "Uploaded",
    "WarmStats",
]

#: A template's durable capture, per the log: (key, guest token, source sandbox; None: an image)
TemplateLocation = tuple[str, str | None, str | None]
TemplateLocator = Callable[[str], Awaitable[TemplateLocation | None]]
#: told (sandbox id, why, cause) when a running sandbox's VM died unasked; cause: "oom", "disk-full"
#: (`diskwatch.py`), "block-service" (a lazy image's service stayed down) or "crash" (any other)
Died = Callable[[str, str, str], Awaitable[None]]
#: run by a take-over once the capture is here and fits this node's disks (`take_over_paused`)
Claim = Callable[[], Awaitable[None]] | None
#: told (op, stage, seconds, start) of each stage of the host's work it timed: a create's, a
#: resume's or a fork's `restore` (until the VM runs) and `envd_ready` (then until envd was
#: initialised); `start` "warm" for a create a warm VM took, else "cold" (`aenv_lifecycle_seconds`)
Stage = Callable[[str, str, float, str], None]


@dataclass(frozen=True)
class GuestVolume:
    """A volume the sandbox mounts: in volume slot i for the i-th of them."""

    volume_id: str
    name: str
    path: str


@dataclass(frozen=True)
class GuestConfig:
    """What envd in a sandbox is told at every (re)start via /init."""

    env_vars: dict[str, str] = field(default_factory=dict)
    access_token: str | None = None
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    volumes: tuple[GuestVolume, ...] = ()
    #: (how many, how long) envd keeps ended processes for `commands.connect(pid)`
    ended_keep: tuple[int, float] | None = None
    #: a create maps its template's RAM copy-on-write (a snapshot fork's child)
    copy_on_write: bool = False

    def init_body(self, sandbox_id: str) -> dict[str, object]:
        """No `defaultUser`/`defaultWorkdir`: the restored guest keeps the ones it was
        captured with — envd's own (`user`, its home) for `base`, a built template's USER
        and WORKDIR for that template. `envVars` merge over the captured ones (a built
        template's ENV), so the sandbox's own values win."""
        body: dict[str, object] = {
            "envVars": self.env_vars,
            "accessToken": self.access_token,
            "hostname": sandbox_id[:63],
        }
        if self.volumes:  # E2B's /init field; mounted by envd (idempotent on a resume)
            body["volumeMounts"] = [
                {"name": v.name, "path": v.path, "serial": VOLUME_SERIAL.format(i)}
                for i, v in enumerate(self.volumes)
            ]
        if self.ended_keep is not None:  # aenv's own fields (envd.guest_init.ended_keep)
            body["aenvEndedKeep"], body["aenvEndedKeepS"] = self.ended_keep
        return body


@dataclass(frozen=True)
class WarmStats:
    """A node's warm pool (`warm.py`): VMs ready per template, claims hit/missed, MiB held."""

    ready: dict[str, int] = field(default_factory=dict)
    hits: int = 0
    misses: int = 0
    mem_mib: int = 0
    #: the warm VMs' QEMU processes
    pids: tuple[int, ...] = ()


@dataclass(frozen=True)
class RamPoolStats:
    """The RAM pool's ready copies on disk (`runtime/rampool.py`), all evictable."""

    bytes: int = 0
    files: int = 0
    sources: int = 0
    budget: int = 0


@dataclass(frozen=True)
class Capture:
    """A capture the host took: a pause's (its sandbox's paused state) or a snapshot's."""

    snapshot_id: str
    template_id: str
    size_bytes: int
    #: how long the sandbox stood still for it
    stopped_ms: float = 0.0
    #: whether it holds the guest's memory (False: a filesystem-only pause)
    memory: bool = True


@dataclass(frozen=True)
class ImageSource:
    """An image to make a template of: a local OCI layout/archive, or a registry reference
    with, for a private registry, its login (read from the secrets bucket just now)."""

    path: str | None = None
    ref: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    #: free space its root disk keeps (None: the node's `image_free_bytes`)
    free_bytes: int | None = None

    def __str__(self) -> str:
        return self.ref or self.path or "?"


@dataclass(frozen=True)
class ImportedImage:
    digest: str
    disk_size_mb: int


@dataclass(frozen=True)
class Accelerator:
    """How this host runs guests, for heartbeats and benchmarks."""

    accel: str
    reason: str
    vmm: str


class LocalVolumes(Protocol):
    """A node's volume images (`workers/node/volumes/images.py`; records only in the
    VM-less `MemoryHost`), as the worker and its releaser use them."""

    def lock(self, volume_id: str) -> asyncio.Lock:
        """One operation on a volume's image at a time on this node."""

    def held_by(self, holder: str) -> list[str]:
        """The volumes `holder` has attached here (what its end must release)."""
        ...

    async def prepare(self, volume_id: str, version: str | None, holder: str) -> Path:
        """The image `holder` attaches, holding `version` (pulled or made if need be);
        recorded as held first. Under `lock`."""
        ...

    async def upload(self, volume_id: str, holder: str) -> tuple[str, int] | None:
        """What `holder` left in the image, as a new version in the repository: (its
        key, its stored size); None where nothing can be made durable. Under `lock`."""
        ...

    def released(self, volume_id: str, version: str | None) -> None:
        """The log released the volume: the image here is `version` now."""
        ...

    def forget_holder(self, volume_id: str) -> None:
        """The holder recorded here no longer has the volume (the log moved it on)."""
        ...


class Host(Protocol):
    """The sandboxes of one node. Every method is idempotent where a redelivered command
    could call it twice (a create of a sandbox that runs returns; a kill of one that is
    gone says False)."""

    @property
    def capacity(self) -> int: ...

    @property
    def free(self) -> int: ...

    @property
    def running(self) -> int: ...

    @property
    def paused_count(self) -> int:
        """Paused sandboxes whose captures this node holds (for the heartbeat)."""

    @property
    def accelerator(self) -> Accelerator: ...

    def runs(self, sandbox_id: str) -> bool: ...

    def holds_paused(self, sandbox_id: str) -> bool: ...

    def held_capture(self, sandbox_id: str) -> str | None:
        """The id of the capture this node holds of a paused sandbox (None: none held)."""
        ...

    def lock(self, sandbox_id: str) -> asyncio.Lock:
        """Serialises operations on one sandbox (a kill waits for a create to finish)."""

    def upstream(self, sandbox_id: str) -> str | None:
        """The address that reaches this sandbox's guest ports, if it runs here."""

    def on_gone(self, hook: Callable[[str], None]) -> None:
        """Call `hook(sandbox_id)` when a sandbox's VM goes away (pause, kill, close)."""

    def on_died(self, hook: Died) -> None:
        """Call `hook(sandbox_id, why, cause)` when a running VM exits on its own."""

    def on_stage(self, hook: Stage) -> None:
        """Call `hook(op, stage, seconds, start)` per stage of a create, resume or fork."""

    def vm_guest_ram(self) -> dict[int, int]:
        """The VMs running here (none for a host without VMs): QEMU pid → guest RAM, MiB."""

    def set_template_locator(self, locate: TemplateLocator) -> None: ...

    @property
    def volumes(self) -> LocalVolumes:
        """This node's volume images."""

    async def volume_slots(self, template_id: str) -> int:
        """How many volumes a sandbox of the template can mount (0: its capture is from
        before volume slots); `HostError` when the template is not to be had."""

    async def hold_template(self, template_id: str) -> None:
        """The template's capture on this disk, fetched if need be, before a create claims
        its sandbox: a `HostError` with code `unavailable` (no disk room for it, its bytes
        nowhere this node can get them) hands the create to another node."""

    async def create(self, sandbox_id: str, template_id: str, guest: GuestConfig) -> None:
        """Start the sandbox: a warm VM of the template if the pool has one (not for a
        sandbox with volumes: a warm VM's slots are placeholders), else a restore; its
        `guest.volumes` must have been prepared (`volumes`)."""

    def started_warm(self, sandbox_id: str) -> bool:
        """Whether the running sandbox was a warm VM handed over (not a restore)."""

    def start_warm_pool(self, spare_mib: Callable[[], int]) -> None:
        """Keep warm VMs from now on, within `spare_mib` (room the sandboxes leave)."""

    def warm_stats(self) -> WarmStats: ...

    def held_templates(self) -> tuple[str, ...]:
        """Templates whose capture is on this disk (the heartbeat's: placement prefers them)."""

    def ram_pool_stats(self) -> RamPoolStats:
        """What the RAM pool holds on disk (none for a host without VMs)."""

    async def pause(
        self,
        sandbox_id: str,
        *,
        keep_memory: bool = True,
        guest_defaults: dict[str, object] | None = None,
    ) -> Capture:
        """Capture a running sandbox and release its VM; `keep_memory` False keeps only
        its disk (the resume boots it again, telling envd `guest_defaults`: what
        `flush_guest` answered)."""
        ...

    async def flush_guest(self, sandbox_id: str) -> dict[str, object]:
        """A running guest's writes flushed to its disk, and what its envd was told (the
        defaults a boot of that disk must be told again); `HostError` when it does not
        answer."""
        ...

    async def resume(self, sandbox_id: str) -> str:
        """Restore a sandbox paused here, processes and memory intact; its template. The
        capture it ran from is kept until `resume_recorded`."""

    def resume_recorded(self, sandbox_id: str) -> None:
        """The log holds the sandbox's resume: what it was restored from can go."""

    async def undo_resume(self, sandbox_id: str) -> bool:
        """A resume the log failed meanwhile: its VM goes, the capture it ran from is held
        paused again, whole (False: none was kept)."""

    async def reconfigure(self, sandbox_id: str, guest: GuestConfig) -> None:
        """A running sandbox lives under `guest`'s egress rules from now on (swapped at
        once), and its pause keeps them for its resume; the rest of a guest config is fixed
        at its start. `HostError` when it does not run here."""

    def running_ids(self) -> list[str]:
        """The sandboxes whose VMs run here."""
        ...

    async def guest_metrics(self, sandbox_id: str) -> dict[str, Any] | None:
        """envd's resource snapshot of a running guest (None: not running, no answer)."""
        ...

    def console_log(self, sandbox_id: str) -> tuple[Path, int] | None:
        """The file a running guest's console writes to, and where the sandbox's own part
        of it starts (a warm VM wrote before its claim); None: none."""
        ...

    async def take_over_paused(
        self, sandbox_id: str, template_id: str, snapshot_id: str, guest: GuestConfig, claim: Claim
    ) -> None:
        """A sandbox paused on a node that is gone: its capture comes from the repository
        (then `resume` it as any other). `claim` runs once the capture is here (it fits
        this node's disks), before its volumes come: their attachment moves with it, and a
        take-over refused leaves them where they were."""

    async def fork(self, parent_id: str, children: dict[str, GuestConfig]) -> dict[str, str | None]:
        """Children of a running sandbox: child id → error (None when it runs)."""

    async def snapshot(self, sandbox_id: str, name: str) -> Capture:
        """A persistent snapshot of a running sandbox (which keeps running): template
        `name` on this node."""

    async def kill(self, sandbox_id: str) -> bool: ...

    def adopt_paused(
        self,
        sandbox_id: str,
        template_id: str,
        snapshot_id: str,
        guest: GuestConfig,
        *,
        durable: bool,
    ) -> bool:
        """After a restart: take back a paused sandbox whose capture survived (False: it
        did not). `durable`: the repository holds a copy of this capture."""

    async def sweep_leftovers(self) -> int:
        """After reconcile: remove VM directories and captures a crash left behind; how
        many."""

    def drop_capture(self, snapshot_id: str) -> None:
        """A stale local copy of a capture (its sandbox was killed or moved away)."""

    def reload_templates(self) -> int:
        """Snapshot templates this node took in an earlier life; how many."""

    async def import_image(
        self,
        name: str,
        source: ImageSource,
        *,
        vcpus: int,
        mem_mib: int,
        progress: Callable[[str], None] | None = None,
    ) -> ImportedImage:
        """An OCI image becomes template `name` on this node (booted once, captured);
        `progress` hears each step (called from a worker thread)."""

    async def forget_template(self, name: str) -> None: ...

    def collect_soon(self) -> None:
        """Free what killed sandboxes left behind, off the command path."""

    async def close(self) -> None: ...


class _BaseImage(Protocol):
    @property
    def digest(self) -> str: ...  # the recipe that built it

    @property
    def content(self) -> str | None: ...  # its bytes (None: taken before it was recorded)


class Manifest(Protocol):
    """A stored capture's manifest: the base image it stacks on, the runtime disk its node
    manifest names (`download` refuses other bytes than theirs), its blobs' bytes."""

    @property
    def base_image(self) -> _BaseImage: ...

    @property
    def node_manifest(self) -> dict[str, Any]: ...

    @property
    def stored_bytes(self) -> int: ...


class Fetched(Protocol):
    """A capture rebuilt on this node's disk."""

    @property
    def dir(self) -> Path: ...

    @property
    def blobs_fetched(self) -> int: ...

    @property
    def bytes_fetched(self) -> int: ...


class Uploaded(Protocol):
    @property
    def blobs_uploaded(self) -> int: ...

    @property
    def bytes_uploaded(self) -> int: ...


class CaptureRepository(Protocol):
    """Where captures become durable (S3, a shared filesystem), by snapshot id."""

    async def upload(
        self, snapshot_dir: Path, *, base_image_digest: str, snapshot_id: str
    ) -> Uploaded: ...

    async def get_manifest(self, snapshot_id: str) -> Manifest: ...

    async def download(
        self,
        snapshot_id: str,
        dest_dir: Path,
        base_image_path: Path,
        *,
        layers_dir: Path | None = None,
        base_content: str | None = None,
        runtime_content: str | None = None,
        foreign: bool = False,
    ) -> Fetched: ...

    async def upload_volume(self, image: Path, *, key: str, volume_id: str) -> object: ...

    async def download_volume(self, key: str, dest: Path) -> object: ...
