"""`HostError`: how the host tells the worker an operation failed, and what kind of
failure it is for the client (`workers/node/ports.py` re-exports it with the ports)."""

from __future__ import annotations

__all__ = ["HostError"]


class HostError(Exception):
    """A sandbox operation on this node failed; the message is safe to show a user.
    `code`: what kind of failure it is for the client, when not the node's own (`invalid`:
    the request cannot work here; `conflict`: something else holds what it needs)."""

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code

    @classmethod
    def about(cls, what: str, cause: BaseException) -> HostError:
        """`what` failed for `cause`, its code kept: a full disk stays `unavailable`."""
        return cls(f"{what}: {cause}", code=cause.code if isinstance(cause, HostError) else None)
