"""One JSON log format for every aenv process: a line is one object.

    {"ts": "2026-01-02T03:04:05.678+00:00", "level": "INFO", "logger": "workers.node.host",
     "msg": "sandbox … up", "service": "aenv-node", "trace_id": "…", "span_id": "…",
     "sandbox_id": "…"}

`trace_id`/`span_id` come from the OpenTelemetry span current when the line was written
(a line and the trace it belongs to are found from each other), `sandbox_id` (or
`template_id`, `build_id`) from what the work at hand is about (`bus.logcontext`); each is
left out where not known. A traceback is the `exc_info` field of its line, never lines of
its own. Progress lines (`say`: "starting embedded NATS", the roles' READY markers) are
records of the logger `aenv.progress`; what a process writes past logging — a library's
print, a child's output — is wrapped into a record by whoever reads it, naming the service
it came from (`aenv.logformat`). So every line of a stack's log (`aenv up`'s `aenv.log`) and of
a role's journal parses as JSON.
"""

from __future__ import annotations

import logging
import os
import sys
from types import TracebackType
from typing import Any

from opentelemetry import trace
from pythonjsonlogger.json import JsonFormatter

from aenv.logformat import set_service
from bus import logcontext

__all__ = ["configure"]


class _Context(logging.Filter):
    """Puts the current trace and the bound log fields on each record."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            record.trace_id = f"{ctx.trace_id:032x}"
            record.span_id = f"{ctx.span_id:016x}"
        for key, value in logcontext.current().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


class _Json(JsonFormatter):
    def process_log_record(self, log_data: dict[str, Any]) -> dict[str, Any]:
        return {"ts": log_data.pop("ts", None), **log_data}  # the time first, as a reader expects


def _formatter(service: str) -> logging.Formatter:
    return _Json(
        ["levelname", "name", "message"],
        timestamp="ts",
        static_fields={"service": service},
        rename_fields={"levelname": "level", "name": "logger", "message": "msg"},
    )


def configure(service: str, level: str | None = None) -> None:
    """Every record of this process as one JSON line on stderr (a service manager's journal,
    or the supervisor that reads it): the root logger's only handler, Python warnings and
    uncaught exceptions included. Libraries that bring their own handlers (uvicorn,
    Litestar) are told not to (`log_config=None`, `logging_config=None`) by their callers."""
    set_service(service)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_formatter(service))
    handler.addFilter(_Context())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level or os.environ.get("AENV_LOG_LEVEL", "INFO"))
    # a line per request of the health checks' S3 probe is noise, not news
    for chatty in ("httpx", "httpcore"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    logging.captureWarnings(True)
    sys.excepthook = _log_uncaught


def _log_uncaught(
    kind: type[BaseException], value: BaseException, tb: TracebackType | None
) -> None:
    logging.getLogger("aenv").critical("uncaught exception", exc_info=(kind, value, tb))
