"""Node worker settings, validated once at start (`AENV_*` environment variables)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from workers.node.warmsize import WarmPolicy

#: The longest path a unix socket binds to on Linux: `sun_path` holds 108 bytes with its NUL.
#: A longer one fails deep in the block service's start as a bare "AF_UNIX path too long".
UNIX_PATH_MAX = 107


def socket_path_problem(path: Path) -> str | None:
    """Why the block service's socket cannot be `path` (None: it can), naming the setting
    that fixes it: a node must refuse this at start, not fail binding it minutes later."""
    n = len(str(path).encode())
    if n <= UNIX_PATH_MAX:
        return None
    return (
        f"AENV_BLOCKS_SOCKET: the block service's socket path {str(path)!r} is {n} bytes, "
        f"a unix socket's path holds at most {UNIX_PATH_MAX}: set AENV_BLOCKS_SOCKET to a "
        "shorter path (unset, it is <AENV_STATE_DIR>/blocks/blocks.sock)"
    )


def _default_node_id() -> str:
    host = "".join(c for c in socket.gethostname().lower() if c.isalnum())
    return (host or "node")[:24]


class NodeSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AENV_", frozen=True, extra="ignore")

    node_id: str = Field(default_factory=_default_node_id, pattern=r"^[a-z0-9-]{1,32}$")
    #: What runs the sandboxes: QEMU microVMs, or records in memory (no VMs, no root: the
    #: VM-less test tier and fleet simulations; `workers/node/memory.py`).
    node_host: Literal["qemu", "memory"] = "qemu"
    #: How long each operation of the in-memory host takes (`MemoryHost.delay_s`): a VM's
    #: work in a simulation, or the window in which a test's concurrent requests meet (an
    #: import they all wait for). No effect on QEMU.
    memory_host_delay_s: float = Field(default=0.0, ge=0, le=60)
    #: Templates (comma-separated, `*`: all) whose fetch the in-memory host refuses as a
    #: full disk budget would (`MemoryHost.no_room_for`): a node that runs out of disk
    #: mid-create, for tests of placement. No effect on QEMU.
    memory_host_no_room_for: str = ""
    state_dir: Path = Path("/var/lib/aenv/node")
    #: Sandboxes this node holds at most (running), whatever room its memory and vCPUs
    #: leave; placement skips a full node.
    capacity: int = Field(default=32, ge=1)
    #: Memory (MiB) and vCPUs this node gives sandboxes. Unset: the host's own — its
    #: MemTotal less `reserved_memory_mib` for the host, and its CPU count.
    memory_mib: int | None = Field(default=None, ge=128)
    vcpus: int | None = Field(default=None, ge=1)
    reserved_memory_mib: int = Field(default=1024, ge=0)
    #: How far the sizes of the sandboxes a node takes may exceed its memory and vCPUs. A
    #: guest's RAM is a file it touches lazily (an idle 512 MiB guest holds ~100 MiB) and
    #: an agent's sandbox idles most of the time — it waits for its model — so overcommit
    #: is the norm, of CPU above all (a fork of 16 on a 2-core node is the common case);
    #: 1.0 means none. A node pulls a create only while the template's size fits.
    memory_overcommit: float = Field(default=1.5, gt=0)
    cpu_overcommit: float = Field(default=16.0, gt=0)
    #: Network namespace/interface prefix; distinct per stack sharing a host.
    slot_prefix: str = Field(default="aenv", pattern=r"^[a-z]{1,8}$")
    #: The node's sandbox proxy (for APIs on other hosts: `AENV_PROXY_VIA_NODE` there).
    #: Port 0 picks a free one; `proxy_advertise` is the host:port others dial (default:
    #: proxy_host and the bound port).
    proxy_host: str = "127.0.0.1"
    proxy_port: int = Field(default=0, ge=0, le=65535)
    proxy_advertise: str | None = None
    #: Range the slots' host-side /30s come from (one per running sandbox); change it on
    #: hosts whose own networks overlap the default (the pool refuses to start over a route).
    slot_cidr: str = "10.213.0.0/16"
    #: Ready network slots kept warm (each ~50 ms to build): enough for a 16-way fork.
    slot_pool: int = Field(default=16, ge=0)
    #: Whether guest traffic may leave the node at all (what each sandbox's policy allows:
    #: `allowInternetAccess`, `network.allowOut`), forwarded and NATed by the host
    #: (`net.uplink`; turns on the host's IPv4 forwarding). Off by default: no egress.
    egress_enabled: bool = False
    #: What envd in every guest keeps of ended processes for `commands.connect(pid)` (exit
    #: code and the last 64 KiB of each output stream; docs/envd.md): the most recent
    #: `envd_ended_keep`, each for `envd_ended_keep_s` after its end. Sent in each /init.
    envd_ended_keep: int = Field(default=64, ge=0, le=10_000)
    envd_ended_keep_s: float = Field(default=600.0, ge=0, le=7 * 86400)
    #: Free space a guest image's root disk keeps beyond the image, for its sandboxes
    #: (pip installs, clones): the disk is sparse, so it costs host disk only once written.
    #: Part of each image's recipe, so a change builds new images; a template may ask for
    #: its own (a build's `minFreeDiskMb`, `aenv template pull --disk`).
    image_free_bytes: int = Field(default=8 << 30, ge=0)
    #: Node-local cache of snapshot blobs pulled from the repository (LRU beyond this; an
    #: upper cap: the disk budget may give it less, `disk.DiskBudget.blob_cache_room`).
    blob_cache_bytes: int = Field(default=10 << 30, ge=0)
    #: Images a node needs by content and lacks (a capture taken over them on another
    #: node) are held lazily (issue 29): their disk is read through the node's block
    #: service, which fetches the chunks a guest reads from the repository on first read,
    #: instead of downloading the whole disk first. Needs a repository.
    lazy_images: Literal["off", "on"] = "off"
    #: The block service's unix socket, its chunk cache and that cache's cap (LRU). None:
    #: `<state_dir>/blocks/blocks.sock` and `<state_dir>/blocks`.
    blocks_socket: Path | None = None
    blocks_cache_dir: Path | None = None
    blocks_cache_bytes: int = Field(default=4 << 30, ge=0)
    #: The node's one disk budget (images-at-scale S8): what its state dir and image cache
    #: may hold together; eviction keeps them under it. None: `disk_budget_share` of the
    #: filesystems holding them (summed when they differ).
    disk_budget_bytes: int | None = Field(default=None, ge=0)
    disk_budget_share: float = Field(default=0.8, gt=0, le=1)
    #: Kept free under the budget for running VMs' top layers, which grow unasked.
    disk_headroom_bytes: int = Field(default=1 << 30, ge=0)
    #: The RAM pool's budget: ready copies of template RAM files (a create of a sandbox
    #: that may pause renames one into place instead of copying ~150 MiB), two per template
    #: restored lately; least recently used templates' copies go first. 0: no pool.
    ram_pool_bytes: int = Field(default=2 << 30, ge=0)
    #: How long a VM stopped by a write that found the host's disk full may stay stopped
    #: while the node makes room (`diskwatch.py`); then it is ended (`SandboxKilled`,
    #: cause `disk-full`) instead of standing still while called running.
    disk_full_grace_s: float = Field(default=10.0, gt=0, le=600)
    #: Heartbeat period in the nodes bucket; missing 3 of them marks the node gone, and its
    #: paused sandboxes resume elsewhere from the snapshot repository (`bus.nodes`).
    heartbeat_s: float = Field(default=5.0, gt=0)
    #: How often the node samples its guests' resources and reads their consoles (E2B's
    #: sandbox metrics and logs, `observe.py`).
    metrics_every_s: float = Field(default=5.0, gt=0)
    #: The warm pool (`warm.py`): memory (MiB, the templates' sizes) its warm VMs may hold
    #: at most — 0 turns it off; at most `warm_pool_max` VMs of one template; the
    #: templates kept warm before their first create (comma-separated); a template
    #: without a create for `warm_pool_idle_s` keeps none.
    warm_pool_mib: int = Field(default=4096, ge=0)
    warm_pool_max: int = Field(default=8, ge=0, le=64)
    warm_pool_keep: str = "base"
    warm_pool_idle_s: float = Field(default=600.0, gt=0)
    #: What Prometheus sends to scrape the node's `/metrics` on its proxy port
    #: (`Authorization: Bearer <token>`); the same token as the APIs'. None: no one may.
    metrics_token: SecretStr | None = None
    #: The repository GC (images-at-scale S11, `workers/snapshot/gcrun.py`): how often one
    #: node of the fleet collects (the period of its lease; 0: never), how old a blob no
    #: manifest names must be to go (an upload writes its blobs before its manifest), and
    #: how long an image no capture names is kept (a template whose capture is not uploaded
    #: yet names its image on its node only).
    repository_gc_every_s: float = Field(default=3600.0, ge=0)
    repository_gc_min_age_s: float = Field(default=3600.0, ge=0)
    repository_image_grace_s: float = Field(default=7 * 86400.0, ge=0)
    #: vCPUs and RAM of the default `base` template.
    base_vcpus: int = Field(default=1, ge=1)
    base_mem_mib: int = Field(default=512, ge=128)
    #: Also serve E2B's `code-interpreter-v1` template (`e2b-code-interpreter`'s default):
    #: its image is built on first start (minutes, then cached by digest) and captured
    #: with its kernel started before the node says it is ready (docs/code-interpreter.md).
    code_interpreter: bool = False
    #: vCPUs and RAM of `code-interpreter-v1` (a kernel with pandas and matplotlib loaded).
    code_interpreter_vcpus: int = Field(default=1, ge=1)
    code_interpreter_mem_mib: int = Field(default=1024, ge=256)
    #: A virtio-balloon with free page reporting in every VM this node boots (templates
    #: captured from then on carry it): memory a guest frees goes back to the host within
    #: seconds and out of its captures (docs/snapshots.md, "Balloon").
    balloon: bool = False

    @property
    def blocks_dir(self) -> Path:
        """Where the block service keeps its chunk cache, pid file and stats."""
        return self.blocks_cache_dir or self.state_dir / "blocks"

    @property
    def blocks_socket_path(self) -> Path:
        return self.blocks_socket or self.state_dir / "blocks" / "blocks.sock"

    @model_validator(mode="after")
    def _socket_fits(self) -> NodeSettings:
        """A lazy-images node's socket path must bind (`socket_path_problem`); one set
        explicitly must whatever the mode (a node with lazy entries serves them off too)."""
        if self.lazy_images == "on" or self.blocks_socket is not None:
            problem = socket_path_problem(self.blocks_socket_path)
            if problem is not None:
                raise ValueError(problem)
        return self

    def warm_policy(self) -> WarmPolicy | None:
        """The warm pool's sizing, or None when it is off."""
        if self.warm_pool_mib <= 0 or self.warm_pool_max <= 0:
            return None
        keep = frozenset(t.strip() for t in self.warm_pool_keep.split(",") if t.strip())
        return WarmPolicy(
            max_per_template=self.warm_pool_max,
            budget_mib=self.warm_pool_mib,
            idle_s=self.warm_pool_idle_s,
            keep=keep,
        )
