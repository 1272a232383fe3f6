"""Errors of the bus. Driver (nats-py) errors are translated into these at the adapter.

`RetryableError` and `PermanentError` are what message handlers raise to tell the consumer
wrapper how to settle a message; they carry their own retry policy.
"""

from __future__ import annotations

from domain import RejectionCode

__all__ = [
    "BusError",
    "ConcurrencyError",
    "DecodeError",
    "InvalidName",
    "LimitsMismatch",
    "PermanentError",
    "PublishError",
    "ReplicasMismatch",
    "RetryableError",
    "StaleDuplicate",
]


class BusError(Exception):
    """Root of every error raised by `bus`."""


class ConcurrencyError(BusError):
    """Someone appended to the aggregate since we loaded it: reload, decide again, retry."""

    def __init__(self, subject: str, expected_seq: int, detail: str = "") -> None:
        super().__init__(f"{subject}: expected last sequence {expected_seq} ({detail})")
        self.subject = subject
        self.expected_seq = expected_seq


class StaleDuplicate(ConcurrencyError):
    """The event was in the log already — the same command decided at the same revision,
    an earlier delivery's — so JetStream de-duplicated it without checking the expected
    sequence, and the aggregate may have moved on since: reload before believing anything
    about its state (a redelivered create must not start a second VM for a sandbox that
    ran long ago). Not raised for a retry of our own publish whose ack was lost."""

    def __init__(self, subject: str, expected_seq: int, stored_seq: int) -> None:
        super().__init__(subject, expected_seq, f"already stored at {stored_seq}")
        self.stored_seq = stored_seq


class InvalidName(BusError, ValueError):
    """An id that cannot be a subject token or consumer name (contains `.`, `*`, `>`, space)."""


class ReplicasMismatch(BusError):
    """An existing stream has other replicas than this role's `AENV_REPLICAS`: the role
    refuses to start rather than change them (`bus.setup.replicas_problem`)."""


class LimitsMismatch(BusError):
    """An existing stream has other limits than this role's `AENV_EVENT_MAX_BYTES`,
    `AENV_EVENT_MAX_MSGS` or `AENV_COMMAND_MAX_MSGS`: the role refuses to start rather
    than change them for the whole fleet (`bus.setup.limits_problem`; `aenv log limits
    set` changes them)."""


class PublishError(BusError):
    """JetStream did not store a message (no stream, timeout after retries, API error)."""


class DecodeError(BusError):
    """A message is not a valid envelope of a known type (or cannot be upcast)."""


class RetryableError(BusError):
    """Handler outcome: try again later. `delay_s` None lets the consumer's backoff decide;
    `final_code` is the rejection's code once the last delivery fails too ("unavailable":
    no node had room, which the API answers 503, not 500)."""

    def __init__(
        self,
        message: str,
        *,
        delay_s: float | None = None,
        final_code: RejectionCode = "internal",
    ) -> None:
        super().__init__(message)
        self.delay_s = delay_s
        self.final_code: RejectionCode = final_code


class PermanentError(BusError):
    """Handler outcome: retrying cannot help. The message is terminated and rejected."""

    def __init__(self, message: str, *, code: str = "permanent") -> None:
        super().__init__(message)
        self.code = code
