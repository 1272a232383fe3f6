"""One-line JSON logs on stderr: the guest console and the node worker parse them."""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def log(level: str, msg: str, **fields: Any) -> None:
    """Write one structured log line; never raises (logging must not break a request)."""
    record: dict[str, Any] = {"ts": round(time.time(), 6), "level": level, "msg": msg}
    record.update(fields)
    try:
        sys.stderr.write(json.dumps(record, default=str) + "\n")
        sys.stderr.flush()
    except Exception:  # stderr gone (console detached): nothing sensible left to do
        pass


def info(msg: str, **fields: Any) -> None:
    log("info", msg, **fields)


def warn(msg: str, **fields: Any) -> None:
    log("warn", msg, **fields)


def error(msg: str, **fields: Any) -> None:
    log("error", msg, **fields)
