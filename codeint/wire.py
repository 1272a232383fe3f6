"""E2B's code-interpreter wire format: the NDJSON lines `/execute` streams, as pure functions.

What the SDKs parse (e2b_code_interpreter.models._parse_output and the JS twin): one JSON
object per line with a `type` — `stdout`/`stderr` (`text`, `timestamp` in unix ns),
`result` (one field per MIME type, `is_main_result`, `extra` for the rest), `error`
(`name`, `value`, `traceback`), `number_of_executions` (`execution_count`). Kernels speak
Jupyter's messages; these functions turn one into the other, so they are tested apart from
any kernel.
"""

from __future__ import annotations

import json
import time
from typing import Any

#: Jupyter MIME type → the field of E2B's `Result` that carries it.
MIME_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "e2b/data": "data",  # a pandas DataFrame as columns (kernel_startup.py)
    "e2b/chart": "chart",  # a matplotlib figure's data (kernel_startup.py)
}

#: Languages a context can have, and what clients may call them.
LANGUAGES = ("python", "bash")
_ALIASES = {"python3": "python", "py": "python", "sh": "bash", "shell": "bash"}


def normalize_language(language: str | None) -> str:
    """The context language a request names (none = python); unknown names pass through
    for the caller to refuse."""
    if not language:
        return "python"
    lang = language.strip().lower()
    return _ALIASES.get(lang, lang)


def now_ns() -> int:
    return time.time_ns()


def line(obj: dict[str, Any]) -> bytes:
    """One NDJSON line."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def stream(name: str, text: str, timestamp: int | None = None) -> dict[str, Any]:
    """A stdout/stderr chunk (`name` is Jupyter's stream name)."""
    kind = "stderr" if name == "stderr" else "stdout"
    return {"type": kind, "text": text, "timestamp": now_ns() if timestamp is None else timestamp}


def result(data: dict[str, Any], *, is_main: bool) -> dict[str, Any]:
    """A display or execute result: its MIME bundle spread over E2B's fields.

    A plain-text repr of a str comes quoted from IPython (`'abc'`); E2B's server strips the
    quotes, and clients compare `results[0].text` to the bare value, so this does too.
    """
    out: dict[str, Any] = {"type": "result", "is_main_result": is_main}
    extra: dict[str, Any] = {}
    for mime, value in data.items():
        field = MIME_FIELDS.get(mime)
        if field is None:
            extra[mime] = value
        else:
            out[field] = value
    text = out.get("text")
    if isinstance(text, str) and len(text) >= 2 and text[0] == text[-1] == "'":
        out["text"] = text[1:-1]
    if extra:
        out["extra"] = extra
    return out


def error(name: str, value: str, traceback: list[str] | str) -> dict[str, Any]:
    tb = traceback if isinstance(traceback, str) else "\n".join(traceback)
    return {"type": "error", "name": name, "value": value, "traceback": tb}


def execution_count(n: int) -> dict[str, Any]:
    return {"type": "number_of_executions", "execution_count": n}


def context(context_id: str, language: str, cwd: str) -> dict[str, Any]:
    """A context as `/contexts` answers it (the SDK's `Context.from_json`)."""
    return {"id": context_id, "language": language, "cwd": cwd}


def from_jupyter(
    msg_type: str, content: dict[str, Any], date_ns: int | None = None
) -> dict[str, Any] | None:
    """The E2B line for one IOPub message of an execution (None: nothing to send)."""
    if msg_type == "stream":
        return stream(content.get("name", "stdout"), content.get("text", ""), date_ns)
    if msg_type == "execute_result":
        return result(content.get("data", {}), is_main=True)
    if msg_type == "display_data":
        return result(content.get("data", {}), is_main=False)
    if msg_type == "error":
        return error(
            content.get("ename", "Error"), content.get("evalue", ""), content.get("traceback", [])
        )
    if msg_type == "execute_input":
        return execution_count(int(content.get("execution_count", 0)))
    return None
