"""What the work at hand is about, for the log lines it writes: the sandbox (or template,
build…) a command or request addresses, bound for the duration of its handling.

A context variable rather than logger arguments: the line that says why a restore failed is
written deep in the node's runtime, which never sees the command; the JSON formatter of each
process (`aenv.logs`) reads these fields onto every record written inside `bound(...)`.
Here, on the lowest floor that handles messages, because the consumer wrappers are where a
command's aggregate is first known; the API binds its request's sandbox the same way.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType

__all__ = ["bound", "current"]

_FIELDS: ContextVar[Mapping[str, str]] = ContextVar("aenv_log_fields", default=MappingProxyType({}))


@contextmanager
def bound(**fields: str | None) -> Iterator[None]:
    """Within the block, every log record carries `fields` (None values are left out; inner
    bindings add to outer ones)."""
    token = _FIELDS.set({**_FIELDS.get(), **{k: v for k, v in fields.items() if v}})
    try:
        yield
    finally:
        _FIELDS.reset(token)


def current() -> Mapping[str, str]:
    """The fields bound here (empty outside any `bound`)."""
    return _FIELDS.get()
