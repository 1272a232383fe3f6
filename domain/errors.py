"""Domain errors: the only exceptions `decide` raises.

Each class says *why* a command cannot be carried out, which is all an edge needs to map it
(the API to HTTP 404/409/400, the consumer wrapper to a `CommandRejected` event).
"""

from __future__ import annotations

__all__ = ["Conflict", "CorruptHistory", "DomainError", "Invalid", "NotFound"]


class DomainError(Exception):
    """Root of every domain error; `code` is the stable, machine-readable reason."""

    code = "domain_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(DomainError):
    """The aggregate does not exist (or no longer exists: a killed sandbox). HTTP 404."""

    code = "not_found"


class Conflict(DomainError):
    """The command is valid but the aggregate's current state forbids it. HTTP 409."""

    code = "conflict"


class Invalid(DomainError):
    """The command itself is malformed or out of range, whatever the state. HTTP 400."""

    code = "invalid"


class CorruptHistory(DomainError):
    """`evolve` met an event its state cannot follow: the log, not the caller, is wrong."""

    code = "corrupt_history"
