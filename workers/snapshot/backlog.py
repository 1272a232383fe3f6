"""Captures whose upload failed and is waiting for a retry: what makes a dead S3 visible.

JetStream redelivers a failed upload with backoff (`worker.UPLOAD_BACKOFF`), so nothing is
lost while S3 is down — but until it is back, a paused sandbox lives only on this node's
disk. The node's heartbeat carries `summary()`; the API's readiness and `aenv status`
name it ("3 captures waiting for upload, oldest 40 s").
"""

from __future__ import annotations


class UploadBacklog:
    """Keys (a sandbox, `template:<name>`) whose last upload attempt failed, with when the
    first of their failures happened."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}

    def failed(self, key: str, now: float) -> None:
        self._since.setdefault(key, now)

    def settled(self, key: str) -> None:
        """Uploaded, or moot (resumed, killed, deleted): no longer waiting."""
        self._since.pop(key, None)

    def summary(self, now: float) -> tuple[int, float]:
        """(captures waiting, seconds the oldest has waited since its first failure)."""
        if not self._since:
            return 0, 0.0
        return len(self._since), now - min(self._since.values())
