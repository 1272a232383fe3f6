"""Settings of the API role: waits, the sandbox domain and TLS, builds, retention."""

from __future__ import annotations

from aenv.settings.model import Kind, Setting

__all__ = ["SERVICE"]

_API = ("api",)

SERVICE = (
    Setting(
        "AENV_PROXY_VIA_NODE",
        Kind.BOOL,
        "false",
        _API,
        "Send sandbox traffic through the nodes' proxies instead of straight to the guest: "
        "what APIs on other hosts than their nodes need.",
    ),
    Setting(
        "AENV_UPLOAD_SECRET",
        Kind.SECRET,
        "minted once, kept in the data dir",
        _API,
        "Signs build-context upload links and derives volume tokens; the same on every API "
        "of a fleet (changing it invalidates every volume's token).",
        computed=True,
    ),
    Setting(
        "AENV_DEFAULT_ON_TIMEOUT",
        Kind.CHOICE,
        "pause",
        _API,
        "On TTL expiry: `pause` (aenv's default, nothing is lost) or `kill` (E2B's default).",
        choices=("pause", "kill"),
    ),
    Setting(
        "AENV_CREATE_TIMEOUT_S",
        Kind.FLOAT,
        "120",
        _API,
        "Upper bound on waiting for a create (restore + envd ready), then 504 with the command id.",
    ),
    Setting(
        "AENV_IMAGE_CREATE_TIMEOUT_S",
        Kind.FLOAT,
        "900",
        _API,
        "Upper bound on waiting for the import of an image a create names (pull, conversion, "
        "first boot); the import goes on regardless.",
    ),
    Setting(
        "AENV_COMMAND_TIMEOUT_S",
        Kind.FLOAT,
        "60",
        _API,
        "Upper bound on waiting for other lifecycle outcomes (kill, pause, resume).",
    ),
    Setting(
        "AENV_PLACEMENT_TIMEOUT_S",
        Kind.FLOAT,
        "10",
        _API,
        "How long a create may wait for a node to take it; then 503 (no room in the fleet).",
    ),
    Setting(
        "AENV_SNAPSHOT_FORK_MAX",
        Kind.INT,
        "100",
        _API,
        "Most children one fork of a snapshot may ask for (`POST /snapshots/{id}/fork`, "
        "E2B's bound); more is a 400.",
    ),
    Setting(
        "AENV_TEAM_MAX_SANDBOXES",
        Kind.INT,
        "0",
        _API,
        "Sandboxes a team may have running at once (creating, running, resuming; paused "
        "ones do not count); past it a create, resume or fork answers 429 with Retry-After "
        "(0: no limit but the fleet's room; docs/scale.md, admission control).",
    ),
    Setting(
        "AENV_TEAM_CREATES_PER_S",
        Kind.FLOAT,
        "0",
        _API,
        "Sandboxes per second a team may start (creates and fork children), fleet-wide; "
        "past it 429 with Retry-After (0: no limit).",
    ),
    Setting(
        "AENV_TEAM_CREATES_BURST",
        Kind.INT,
        "0",
        _API,
        "How many sandboxes a team may start at once on top of AENV_TEAM_CREATES_PER_S "
        "(the token bucket's size; 0: one second's worth).",
    ),
    Setting(
        "AENV_TEAM_LIMITS",
        Kind.STR,
        "",
        _API,
        'Per-team overrides of the three above, JSON: {"team": {"max_sandboxes": 50, '
        '"creates_per_s": 10, "burst": 20}}; a key\'s own (aenv keys limits) come first.',
    ),
    Setting(
        "AENV_PIPELINES",
        Kind.BOOL,
        "true",
        _API,
        "Serve least-privilege pipelines (docs/pipelines.md): the teams' NATS ingress "
        "(aenv.in.<team>.<verb>) and the feed of sandbox events with secrets stripped that "
        "pipeline users and auditors read (aenv keys pipeline create). Off: neither.",
    ),
    Setting(
        "AENV_DISK_HEADROOM_BYTES",
        Kind.INT,
        "1073741824",
        ("api", "node"),
        "Room every create keeps on a node's disk beyond the template it fetches (1 GiB); "
        "the same on APIs and nodes: an API answers 503 naming the disk when no node has it.",
    ),
    Setting(
        "AENV_CAPTURE_GRACE_S",
        Kind.FLOAT,
        "120",
        _API,
        "How long a template build's capture is kept once no tag names it, for creates that "
        "resolved the tag a moment earlier.",
    ),
    Setting(
        "AENV_VOLUME_WAIT_S",
        Kind.FLOAT,
        "30",
        _API,
        "How long a create (or a volume API call) waits for a volume its ended sandbox is "
        "still releasing, then 409 with Retry-After.",
    ),
    Setting(
        "AENV_READY_NEEDS_NODE",
        Kind.BOOL,
        "true",
        _API,
        "Whether readiness needs a beating node (one machine). A fleet's APIs turn it off: "
        "no node beating must not take every API out of the load balancer.",
    ),
    Setting(
        "AENV_BUILD_FILES_DIR",
        Kind.PATH,
        "",
        _API,
        "Where uploaded build-context archives go; unset: template file uploads are off.",
    ),
    Setting(
        "AENV_BUILD_PARALLEL",
        Kind.INT,
        "2",
        _API,
        "Template builds one API process runs at once (each drives a build sandbox).",
    ),
    Setting(
        "AENV_PAUSED_RETENTION_S",
        Kind.FLOAT,
        "2592000",
        _API,
        "Paused sandboxes are killed (reason `retention`) and their captures removed this long "
        "after their pause (30 days); 0 keeps them for ever.",
    ),
    Setting(
        "AENV_SANDBOX_DOMAIN",
        Kind.STR,
        "",
        ("api", "up"),
        "The sandbox domain as clients are given it (`E2B_DOMAIN`, with `:port` when not "
        "443): `<port>-<id>.<domain>` host routing, `api.<domain>` the API. `aenv up`: "
        "`aenv.localhost:<tls port>`.",
    ),
    Setting(
        "AENV_TLS_PORT",
        Kind.INT,
        "8443",
        ("api", "up"),
        "Port of the HTTPS listener beside the plain one; 0: no HTTPS (`aenv up` only: a role "
        "alone serves HTTPS exactly when it is given a certificate).",
    ),
    Setting(
        "AENV_TLS_CERT_FILE",
        Kind.PATH,
        "",
        ("api", "up"),
        "Certificate (PEM, leaf first) covering `*.<domain>`; checked at start.",
    ),
    Setting(
        "AENV_TLS_KEY_FILE",
        Kind.PATH,
        "",
        ("api", "up"),
        "The certificate's private key (PEM).",
    ),
)
