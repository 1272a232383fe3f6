"""Settings every role shares: where the fleet's services are, how the event log is shaped,
logging and tracing, the whole stack's supervisor (`aenv up`) and the CLI."""

from __future__ import annotations

from aenv.settings.model import Kind, Setting

__all__ = ["CONNECTIONS"]

_BOTH = ("api", "node")
_ALL = ("api", "node", "up")

CONNECTIONS = (
    Setting(
        "AENV_NATS_URL",
        Kind.URLS,
        "nats://127.0.0.1:4222",
        (*_ALL, "cli"),
        "NATS servers, comma-separated (a cluster: the client fails over between them), "
        "credentials in each URL. `aenv up`: unset runs an embedded server.",
    ),
    Setting(
        "AENV_REPLICAS",
        Kind.INT,
        "1",
        _BOTH,
        "Replicas of every stream and KV bucket a role creates: 1 on one node, 3 on a "
        "3-server cluster; the same on every role. A role whose value differs from an "
        "existing stream's refuses to start naming both (lowering them would give up copies "
        "of the event log, raising them from one node would make every other node's env "
        "file wrong); changing them is an operator's act: `nats stream edit` on every aenv "
        "stream and bucket, then this value everywhere.",
    ),
    Setting(
        "AENV_BUS_PREFIX",
        Kind.STR,
        "",
        _BOTH,
        "Namespace (`[a-z0-9]{0,16}`) of every stream, subject, KV bucket and durable name, so "
        "that several stacks or test sessions share one NATS server. Empty in production.",
    ),
    Setting(
        "AENV_DUPLICATE_WINDOW_S",
        Kind.FLOAT,
        "120",
        _BOTH,
        "JetStream's dedup window: a command or event retried within it is stored once; it "
        "must exceed the longest client retry.",
    ),
    Setting(
        "AENV_REQUEST_TIMEOUT_S",
        Kind.FLOAT,
        "5",
        _BOTH,
        "Per-request timeout towards NATS (publish acks, direct gets, API calls).",
    ),
    Setting(
        "AENV_PUBLISH_RETRY_S",
        Kind.FLOAT,
        "20",
        _BOTH,
        "How long a publish is retried, with the same message id, while nothing can store "
        "it (a reconnect, a cluster electing a stream leader).",
    ),
    Setting(
        "AENV_NODE_TTL_S",
        Kind.FLOAT,
        "30",
        _BOTH,
        "How long a node's capacity entry in the nodes KV bucket lives without a heartbeat.",
    ),
    Setting(
        "AENV_NODE_LOST_AFTER_S",
        Kind.FLOAT,
        "60",
        _BOTH,
        "A node silent this long is gone for good: the timer ends what was under way there "
        "(running sandboxes killed as lost, creates failed, resumes back to paused), unless "
        "no node beats at all.",
    ),
    Setting(
        "AENV_SECRET_TTL_S",
        Kind.FLOAT,
        "3600",
        _BOTH,
        "How long a secret handed to a worker (a build's registry password) is kept.",
    ),
    Setting(
        "AENV_EVENT_MAX_BYTES",
        Kind.INT,
        "0",
        _BOTH,
        "Byte limit of the event log (0: none, bounded by the NATS store). Full, the log "
        "refuses appends (never drops history); NATS reserves the limit from its store when "
        "the stream is made. The same on every role (a role whose value differs from the "
        "stream's refuses to start; `aenv log limits set` changes it); the alert rules warn "
        "at 70 %.",
    ),
    Setting(
        "AENV_EVENT_MAX_MSGS",
        Kind.INT,
        "0",
        _BOTH,
        "Message limit of the event log (0: none); full, it refuses appends. The same on "
        "every role, like AENV_EVENT_MAX_BYTES.",
    ),
    Setting(
        "AENV_COMMAND_MAX_MSGS",
        Kind.INT,
        "1000000",
        _BOTH,
        "Most commands the command queue holds; past it new commands are refused rather "
        "than take the store the event log needs (0: no limit). The same on every role, like "
        "AENV_EVENT_MAX_BYTES.",
    ),
    Setting(
        "AENV_DATABASE_URL",
        Kind.URL,
        "postgresql+asyncpg://postgres@127.0.0.1:5432/aenv",
        (*_ALL, "cli"),
        "Postgres of the read models, `postgresql+asyncpg://user:password@host:5432/db`. "
        "`aenv up`: unset runs an embedded server.",
    ),
    Setting(
        "AENV_POOL_SIZE",
        Kind.INT,
        "10",
        ("api",),
        "Connections in each API process's Postgres pool.",
    ),
    Setting(
        "AENV_S3_ENDPOINT",
        Kind.URL,
        "",
        _ALL,
        "The snapshot repository's S3 endpoint (any S3: SeaweedFS, MinIO, AWS). Unset: "
        "`AENV_SNAPSHOT_DIR`, else no repository; `aenv up` runs an embedded SeaweedFS.",
    ),
    Setting(
        "AENV_S3_ACCESS_KEY",
        Kind.STR,
        "",
        _ALL,
        "Access key of the S3 endpoint.",
    ),
    Setting(
        "AENV_S3_SECRET_KEY",
        Kind.SECRET,
        "",
        _ALL,
        "Secret key of the S3 endpoint.",
    ),
    Setting(
        "AENV_S3_BUCKET",
        Kind.STR,
        "aenv-snapshots",
        _BOTH,
        "The snapshot repository's bucket (aenv creates it).",
    ),
    Setting(
        "AENV_SNAPSHOT_DIR",
        Kind.PATH,
        "",
        _BOTH,
        "The snapshot repository as a directory every node mounts, used when no S3 endpoint "
        "is set.",
    ),
    Setting(
        "AENV_DATA_DIR",
        Kind.PATH,
        "/var/lib/aenv",
        (*_ALL, "cli"),
        "Where a role keeps its data (keys, the stack's servers' data, `stack.json`); "
        "`aenv serve --data-dir` sets it.",
    ),
    Setting(
        "AENV_HOST",
        Kind.STR,
        "127.0.0.1",
        _ALL,
        "Address the API listens on (a fleet: 0.0.0.0).",
    ),
    Setting(
        "AENV_PORT",
        Kind.INT,
        "3000",
        _ALL,
        "Port the API listens on.",
    ),
    Setting(
        "AENV_DRAIN_S",
        Kind.FLOAT,
        "30",
        _BOTH,
        "After SIGTERM the role drains this long at most, then exits anyway.",
    ),
    Setting(
        "AENV_METRICS_TOKEN",
        Kind.SECRET,
        "",
        _ALL,
        "Bearer token Prometheus scrapes every role's `/metrics` with; the same on APIs and "
        "nodes. The API also takes an API key; a node without it refuses every scrape. "
        "`aenv up`: minted once and kept in the data dir.",
    ),
    Setting(
        "AENV_LOG_LEVEL",
        Kind.CHOICE,
        "INFO",
        _ALL,
        "Log level; every line is one JSON object.",
        choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
    ),
    Setting(
        "AENV_TRACE_FILE",
        Kind.PATH,
        "",
        _ALL,
        "Also write every span, one JSON object a line, to this file (tests, debugging); "
        "OTLP export is configured by the standard `OTEL_*` variables.",
    ),
    Setting(
        "AENV_FAILPOINTS_FILE",
        Kind.PATH,
        "",
        _ALL,
        "For fault-injection tests only: a file naming armed failpoints (`NAME`, "
        "`NAME=COUNT` or `NAME=kill` a line, read at most once a second; "
        "`bus/failpoints.py`). Unset: "
        "every failpoint is inert.",
    ),
    Setting(
        "AENV_EVENT_LOOP",
        Kind.CHOICE,
        "uvloop",
        _ALL,
        "The asyncio event loop of every process: `uvloop` (when installed) or `asyncio`.",
        choices=("uvloop", "asyncio"),
    ),
    Setting(
        "AENV_EMBEDDED_S3",
        Kind.BOOL,
        "true",
        ("up",),
        "Whether `aenv up` runs an embedded SeaweedFS as the snapshot repository when no "
        "`AENV_S3_ENDPOINT` is given.",
    ),
    Setting(
        "AENV_RESTART_CAP_S",
        Kind.FLOAT,
        "30",
        ("up",),
        "Longest wait between restarts of a crashed role or embedded server.",
    ),
    Setting(
        "AENV_LOG_FILE",
        Kind.PATH,
        "",
        ("up",),
        "The stack's log file (`aenv up` sets `<data dir>/aenv.log`). Unset: stdout/stderr, "
        "for a service manager's journal.",
    ),
    Setting(
        "AENV_LOG_MAX_MB",
        Kind.FLOAT,
        "64",
        ("up",),
        "The stack's log file is rotated past this many MiB.",
    ),
    Setting(
        "AENV_LOG_BACKUPS",
        Kind.INT,
        "5",
        ("up",),
        "Rotated log files kept.",
    ),
    Setting(
        "AENV_API_URL",
        Kind.URL,
        "",
        ("cli",),
        "The API the sandbox commands talk to (before `E2B_API_URL`, after `--api-url`).",
    ),
    Setting(
        "AENV_API_KEY",
        Kind.SECRET,
        "",
        ("api", "cli"),
        "API: the fleet's first API key, registered by every API at start (unset: one "
        "minted once and kept in the data dir). CLI: the key the sandbox commands send.",
    ),
    Setting(
        "AENV_REGISTRY_PASSWORD",
        Kind.SECRET,
        "",
        ("cli",),
        "Password of a private registry for `aenv template build --username`.",
    ),
)
