"""Settings of the node role: identity, size, disks, pools, network, its proxy."""

from __future__ import annotations

from aenv.settings.model import Kind, Setting

__all__ = ["NODE"]

_NODE = ("node",)

NODE = (
    Setting(
        "AENV_NODE_ID",
        Kind.STR,
        "the host name, lower-case, letters and digits only",
        _NODE,
        "The node's id: distinct in the fleet, stable across restarts, `[a-z0-9-]{1,32}`.",
        computed=True,
    ),
    Setting(
        "AENV_NODE_HOST",
        Kind.CHOICE,
        "qemu",
        _NODE,
        "What runs the sandboxes: `qemu` microVMs, or `memory` records (no VMs: the VM-less "
        "test tier and fleet simulations).",
        choices=("qemu", "memory"),
    ),
    Setting(
        "AENV_MEMORY_HOST_DELAY_S",
        Kind.FLOAT,
        "0",
        _NODE,
        "Tests: how long each operation of the in-memory host takes. No effect on QEMU.",
    ),
    Setting(
        "AENV_MEMORY_HOST_NO_ROOM_FOR",
        Kind.STR,
        "",
        _NODE,
        "Tests: templates (comma-separated, `*`: all) whose fetch the in-memory host refuses "
        "as a full disk would. No effect on QEMU.",
    ),
    Setting(
        "AENV_STOP_DRAIN",
        Kind.CHOICE,
        "off",
        _NODE,
        "What the node does on SIGTERM: `off` (its VMs die with it) or `pause` (it cordons "
        "itself, pauses every sandbox with its memory into the snapshot repository and exits "
        "once each is durable: a restart or upgrade loses none). The systemd unit and the "
        "DaemonSet set `pause`; their stop grace must exceed AENV_STOP_DRAIN_S.",
        choices=("off", "pause"),
    ),
    Setting(
        "AENV_STOP_DRAIN_S",
        Kind.FLOAT,
        "300",
        _NODE,
        "How long the SIGTERM drain (AENV_STOP_DRAIN=pause) may take at most; then the node "
        "stops anyway, with what is not durable yet paused here or running.",
    ),
    Setting(
        "AENV_STATE_DIR",
        Kind.PATH,
        "/var/lib/aenv/node",
        _NODE,
        "The node's own state: VM disks and memory files, captures, its blob cache.",
    ),
    Setting(
        "AENV_RUN_DIR",
        Kind.PATH,
        "/run/aenv",
        _NODE,
        "Runtime files: network slot locks, the cached accelerator probe.",
    ),
    Setting(
        "AENV_IMAGE_CACHE",
        Kind.PATH,
        "/var/lib/aenv/images",
        _NODE,
        "Where guest images (base disks built from OCI images) are cached, by digest.",
    ),
    Setting(
        "AENV_ACCEL",
        Kind.CHOICE,
        "auto",
        _NODE,
        "`kvm` or `tcg` instead of probing whether KVM works (`auto`).",
        choices=("auto", "kvm", "tcg"),
    ),
    Setting(
        "AENV_CAPACITY",
        Kind.INT,
        "32",
        _NODE,
        "Sandboxes this node runs at most, whatever room its memory and vCPUs leave.",
    ),
    Setting(
        "AENV_MEMORY_MIB",
        Kind.INT,
        "",
        _NODE,
        "Memory (MiB) this node gives sandboxes; unset: the host's MemTotal less "
        "`AENV_RESERVED_MEMORY_MIB`.",
    ),
    Setting(
        "AENV_VCPUS",
        Kind.INT,
        "",
        _NODE,
        "vCPUs this node gives sandboxes; unset: the host's CPU count.",
    ),
    Setting(
        "AENV_RESERVED_MEMORY_MIB",
        Kind.INT,
        "1024",
        _NODE,
        "Memory (MiB) kept for the host when `AENV_MEMORY_MIB` is unset.",
    ),
    Setting(
        "AENV_MEMORY_OVERCOMMIT",
        Kind.FLOAT,
        "1.5",
        _NODE,
        "How far the sizes of the sandboxes a node takes may exceed its memory (guest RAM is "
        "a file touched lazily).",
    ),
    Setting(
        "AENV_CPU_OVERCOMMIT",
        Kind.FLOAT,
        "16",
        _NODE,
        "How far the vCPUs of the sandboxes a node takes may exceed its own (agents' "
        "sandboxes idle most of the time).",
    ),
    Setting(
        "AENV_DISK_BUDGET_BYTES",
        Kind.INT,
        "",
        _NODE,
        "Bytes the node's state dir and image cache may hold together; eviction keeps them "
        "under it, and the node says its room in its heartbeat. Unset: "
        "`AENV_DISK_BUDGET_SHARE` of their filesystems.",
    ),
    Setting(
        "AENV_DISK_BUDGET_SHARE",
        Kind.FLOAT,
        "0.8",
        _NODE,
        "Share (0-1] of the filesystems' size the disk budget is when "
        "`AENV_DISK_BUDGET_BYTES` is unset.",
    ),
    Setting(
        "AENV_DISK_FULL_GRACE_S",
        Kind.FLOAT,
        "10",
        _NODE,
        "How long a VM stopped by a full host disk may wait for room; then it is killed "
        "(cause `disk-full`).",
    ),
    Setting(
        "AENV_IMAGE_FREE_BYTES",
        Kind.INT,
        "8589934592",
        _NODE,
        "Free space a guest image's root disk keeps beyond the image (8 GiB, sparse); a "
        "build's `minFreeDiskMb` overrides it.",
    ),
    Setting(
        "AENV_BLOB_CACHE_BYTES",
        Kind.INT,
        "10737418240",
        _NODE,
        "Upper cap of the node-local cache of snapshot blobs pulled from the repository "
        "(LRU; 10 GiB).",
    ),
    Setting(
        "AENV_LAZY_IMAGES",
        Kind.CHOICE,
        "off",
        _NODE,
        "`on`: an image the node needs by content and lacks (a capture taken on another "
        "node) is not downloaded whole: its disk is read through the node's block service, "
        "which fetches the chunks a guest reads from the repository (issue 29).",
        choices=("off", "on"),
    ),
    Setting(
        "AENV_LAYERED_DISKS",
        Kind.CHOICE,
        "on",
        _NODE,
        "`on`: an imported image's root disk is its layer chain's ext4 with its own layer "
        "applied by debugfs, so images on one base share the base's chunks (issue 29); "
        "`off`: every root disk is a fresh mkfs.",
        choices=("off", "on"),
    ),
    Setting(
        "AENV_BLOCKS_SOCKET",
        Kind.PATH,
        "",
        _NODE,
        "The block service's unix socket (AENV_LAZY_IMAGES=on): at most 107 bytes, a node "
        "refuses to start with a longer one. Unset: `<AENV_STATE_DIR>/blocks/blocks.sock`.",
    ),
    Setting(
        "AENV_BLOCKS_CACHE_DIR",
        Kind.PATH,
        "",
        _NODE,
        "The block service's chunk cache, pid file and stats. Unset: `<AENV_STATE_DIR>/blocks`.",
    ),
    Setting(
        "AENV_BLOCKS_CACHE_BYTES",
        Kind.INT,
        "4294967296",
        _NODE,
        "Cap of the block service's chunk cache (LRU; 4 GiB).",
    ),
    Setting(
        "AENV_MAX_LAYER_DEPTH",
        Kind.INT,
        "16",
        _NODE,
        "qcow2 layers a sandbox's disk chain may stack before a pause compacts it.",
    ),
    Setting(
        "AENV_RAM_POOL_BYTES",
        Kind.INT,
        "2147483648",
        _NODE,
        "The RAM pool's budget: ready copies of template RAM files on the node's disk, least "
        "recently used templates' dropped first (2 GiB; 0: no pool).",
    ),
    Setting(
        "AENV_WARM_POOL_MIB",
        Kind.INT,
        "4096",
        _NODE,
        "Memory (MiB) the warm pool's ready VMs may hold at most; 0 turns the pool off.",
    ),
    Setting(
        "AENV_WARM_POOL_MAX",
        Kind.INT,
        "8",
        _NODE,
        "Warm VMs of one template at most.",
    ),
    Setting(
        "AENV_WARM_POOL_KEEP",
        Kind.STR,
        "base",
        _NODE,
        "Templates kept warm from the start, before their first create (comma-separated).",
    ),
    Setting(
        "AENV_WARM_POOL_IDLE_S",
        Kind.FLOAT,
        "600",
        _NODE,
        "A template without a create this long keeps no warm VM.",
    ),
    Setting(
        "AENV_BASE_VCPUS",
        Kind.INT,
        "1",
        _NODE,
        "vCPUs of the default `base` template.",
    ),
    Setting(
        "AENV_BASE_MEM_MIB",
        Kind.INT,
        "512",
        _NODE,
        "Memory (MiB) of the default `base` template.",
    ),
    Setting(
        "AENV_CODE_INTERPRETER",
        Kind.BOOL,
        "false",
        _NODE,
        "Also serve E2B's `code-interpreter-v1` template (built and captured at start).",
    ),
    Setting(
        "AENV_CODE_INTERPRETER_VCPUS",
        Kind.INT,
        "1",
        _NODE,
        "vCPUs of `code-interpreter-v1`.",
    ),
    Setting(
        "AENV_CODE_INTERPRETER_MEM_MIB",
        Kind.INT,
        "1024",
        _NODE,
        "Memory (MiB) of `code-interpreter-v1`.",
    ),
    Setting(
        "AENV_BALLOON",
        Kind.BOOL,
        "false",
        _NODE,
        "A virtio-balloon with free page reporting in every VM booted from then on (templates "
        "captured after it carry it): memory a guest frees returns to the host within seconds "
        "and leaves its captures. Fork children, whose RAM maps a shared capture, give theirs "
        "back through the ramkeep shim (built with the host's C compiler), never by changing "
        "the capture; without a compiler the balloon stays off.",
    ),
    Setting(
        "AENV_HEARTBEAT_S",
        Kind.FLOAT,
        "5",
        _NODE,
        "Heartbeat period in the nodes bucket; 3 missed mark the node gone.",
    ),
    Setting(
        "AENV_METRICS_EVERY_S",
        Kind.FLOAT,
        "5",
        _NODE,
        "How often the node samples its guests' resources and reads their consoles.",
    ),
    Setting(
        "AENV_REPOSITORY_GC_EVERY_S",
        Kind.FLOAT,
        "3600",
        _NODE,
        "How often one node of the fleet collects the snapshot repository's garbage; 0: never.",
    ),
    Setting(
        "AENV_REPOSITORY_GC_MIN_AGE_S",
        Kind.FLOAT,
        "3600",
        _NODE,
        "How old a blob no manifest names must be before the GC removes it.",
    ),
    Setting(
        "AENV_REPOSITORY_IMAGE_GRACE_S",
        Kind.FLOAT,
        "604800",
        _NODE,
        "How long an image no capture names is kept in the repository (7 days).",
    ),
    Setting(
        "AENV_ENVD_ENDED_KEEP",
        Kind.INT,
        "64",
        _NODE,
        "Ended processes envd in each guest keeps, the most recent ones: `commands.connect(pid)` "
        "to one replays the last 64 KiB of each of its output streams and its exit code "
        "(docs/envd.md). 0: forget a process at its exit, as E2B's envd.",
    ),
    Setting(
        "AENV_ENVD_ENDED_KEEP_S",
        Kind.FLOAT,
        "600",
        _NODE,
        "Seconds envd keeps each ended process (AENV_ENVD_ENDED_KEEP) after its end.",
    ),
    Setting(
        "AENV_EGRESS_ENABLED",
        Kind.BOOL,
        "false",
        _NODE,
        "Whether guest traffic may leave the node at all (as far as each sandbox's policy "
        "allows); turns on the host's IPv4 forwarding.",
    ),
    Setting(
        "AENV_SLOT_PREFIX",
        Kind.STR,
        "aenv",
        _NODE,
        "Network namespace and interface prefix (`[a-z]{1,8}`): distinct per node on one host.",
    ),
    Setting(
        "AENV_SLOT_CIDR",
        Kind.STR,
        "10.213.0.0/16",
        _NODE,
        "Range the sandboxes' host-side /30s come from; change it where the host's own "
        "networks overlap it.",
    ),
    Setting(
        "AENV_SLOT_POOL",
        Kind.INT,
        "16",
        _NODE,
        "Ready network slots kept warm (each ~50 ms to build).",
    ),
    Setting(
        "AENV_PROXY_HOST",
        Kind.STR,
        "127.0.0.1",
        _NODE,
        "Address of the node's sandbox proxy (for APIs on other hosts) and its `/metrics`.",
    ),
    Setting(
        "AENV_PROXY_PORT",
        Kind.INT,
        "0",
        _NODE,
        "Port of the node's proxy; 0 picks a free one.",
    ),
    Setting(
        "AENV_PROXY_ADVERTISE",
        Kind.STR,
        "",
        _NODE,
        "The host:port APIs dial for this node's proxy; unset: its host and bound port.",
    ),
    Setting(
        "AENV_INSECURE_REGISTRIES",
        Kind.STR,
        "",
        _NODE,
        "Registries (host[:port], comma-separated) pulled from over plain HTTP.",
    ),
    Setting(
        "AENV_REGISTRY_MIRRORS",
        Kind.STR,
        "",
        _NODE,
        "Registry mirrors, comma-separated `registry=mirror` pairs, tried before the registry.",
    ),
)
