"""The line format of aenv's logs, apart from the logging set-up (`aenv.logs`): what
`aenv up`, the supervisor and tests need to write or read a line, with the standard
library only (the CLI starts without loading the services' packages).

A line is one JSON object: `ts`, `level`, `logger`, `msg`, `service`, and where known
`trace_id`, `span_id`, `sandbox_id` (`docs/observability.md`). Progress lines are records of
the logger `aenv.progress`; a role's READY marker is one too.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

__all__ = ["PROGRESS", "marks", "message_of", "progress", "record_of", "set_service", "wrap"]

#: The logger of progress lines (`aenv up` shows their `msg`)
PROGRESS = "aenv.progress"

#: This process's service name (`aenv.logs.configure` sets it)
_service = "aenv"


def set_service(service: str) -> None:
    global _service
    _service = service


def record_of(
    msg: str, *, logger: str, level: str = "INFO", service: str | None = None, **fields: Any
) -> str:
    """One line in the format `configure` writes, for text that did not go through logging."""
    doc = {
        "ts": _now(),
        "level": level,
        "logger": logger,
        "msg": msg,
        "service": service or _service,
        **fields,
    }
    return json.dumps(doc, ensure_ascii=False, default=str)


def _now() -> str:
    return datetime.now(UTC).isoformat()  # as python-json-logger writes `ts`


def progress(msg: str) -> str:
    """A progress line (what `aenv up` shows while it waits)."""
    return record_of(msg, logger=PROGRESS)


def wrap(line: str, *, service: str, stream: str) -> str:
    """`line` as one JSON record: passed through when it already is one (a role's own
    records keep their service), else wrapped as a record of `service`'s `stream`."""
    text = line.rstrip("\r\n")
    if text.startswith("{"):
        try:
            if isinstance(json.loads(text), dict):
                return text
        except ValueError:
            pass
    level = "WARNING" if stream == "stderr" else "INFO"
    return record_of(text, logger=stream, level=level, service=service)


def message_of(line: str) -> tuple[str | None, str]:
    """(logger, msg) of one log line; (None, the line) for a line that is no record."""
    text = line.strip()
    if text.startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError:
            return None, text
        if isinstance(doc, dict):
            return str(doc.get("logger")), str(doc.get("msg", ""))
    return None, text


def marks(line: str, marker: str) -> bool:
    """Whether `line` is the progress marker `marker` (a role's `ROLE-READY`): its record,
    or the bare word an older aenv printed."""
    logger, msg = message_of(line)
    return msg == marker and logger in (PROGRESS, None)
