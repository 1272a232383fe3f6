"""The snapshot package's one error root and the few kinds callers must tell apart.

Adapters translate driver errors (botocore, OSError) into these, so the node sees one
vocabulary whatever the backend. Retry policy travels with the type: a
`RetryableStoreError` is worth another attempt after a backoff; anything else is not.
"""

from __future__ import annotations


class SnapshotError(Exception):
    """Root of every error this package raises."""

    retryable = False


class StoreError(SnapshotError):
    """The backend refused or failed an operation in a way retrying will not fix
    (bad credentials, missing bucket permissions, a corrupt object)."""


class RetryableStoreError(StoreError):
    """A transient backend failure (connection reset, 5xx, throttling): retry with backoff."""

    retryable = True


class BlobNotFound(StoreError):
    """No blob with this digest in the store."""


class ManifestNotFound(StoreError):
    """No manifest with this snapshot id in the store."""


class CorruptBlob(StoreError):
    """A blob's bytes do not hash to its digest (truncated or tampered object)."""


class LayoutError(SnapshotError):
    """A local snapshot or disk chain is not what the repository can store or restore
    (broken backing chain, wrong base image, unknown manifest format)."""
