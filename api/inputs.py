"""What a control-plane request may carry, checked before any handler reads it.

Everything a request says ends up in an event on NATS and then in a Postgres row, and each
has limits a client must hear about as a 4xx, not meet as a 500 (or worse, as a poisoned
projection: Postgres refuses a NUL in text and JSONB, so an event holding one would stop the
read model that folds it for good):

- no NUL byte in the path, the query or any string of a JSON body;
- a JSON body of at most `MAX_BODY` bytes (413), nested at most `MAX_DEPTH` levels deep
  (a 100,000-deep array must not send the decoder into a RecursionError).

Headers need no check: the HTTP parser refuses a NUL there before we see the request.
"""

from __future__ import annotations

from typing import Any

import pydantic_core
from litestar import Request
from litestar.exceptions import HTTPException

from api.errors import ApiError

__all__ = ["MAX_BODY", "MAX_DEPTH", "body_problem", "check_request", "text_problem"]

#: A request body becomes one command and one event on NATS, whose default `max_payload`
#: is 1 MiB; half of it leaves room for the envelope and the fields we add.
MAX_BODY = 512 << 10
#: E2B's bodies nest four levels at most (create → network → allowOut → item).
MAX_DEPTH = 32


def text_problem(where: str, value: str) -> str | None:
    """Why `value` cannot be stored, if it cannot: Postgres text holds no NUL."""
    if "\x00" in value:
        return f"{where} contains a NUL byte"
    return None


def _first(problems: Any) -> str | None:
    return next((p for p in problems if p is not None), None)


def body_problem(body: bytes) -> str | None:
    """Why a JSON body is refused (too deep, not JSON, a NUL in a string), or None.

    The walk is iterative and the parser stops at its own depth limit (a few hundred), so
    no body, however deep, recurses in Python."""
    try:
        doc = pydantic_core.from_json(body)
    except ValueError as e:
        if "recursion limit" in str(e):
            return f"JSON body is nested more than {MAX_DEPTH} levels deep"
        return f"request body is not valid JSON: {e}"
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if p := text_problem("a string in the JSON body", value):
                return p
        elif isinstance(value, dict | list):
            if depth > MAX_DEPTH:
                return f"JSON body is nested more than {MAX_DEPTH} levels deep"
            items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
            stack.extend((v, depth + 1) for v in items)
    return None


async def check_request(request: Request[Any, Any, Any]) -> None:
    """Litestar `before_request` hook: refuse what no handler could store or parse.

    It runs after routing, before the handler's parameters are parsed; a body is read
    only for handlers that take one (`data`), so the streaming upload stays a stream. The
    body is cached on the request: the handler parses the same bytes again."""
    problem = text_problem("the path", request.url.path) or _first(
        text_problem(f"query parameter {k!r}", f"{k}{v}") for k, v in request.query_params.items()
    )
    if problem is None and "data" in request.route_handler.parsed_fn_signature.parameters:
        try:
            body = await request.body()
        except HTTPException as e:
            if e.status_code == 413:
                raise ApiError(413, f"request body is larger than {MAX_BODY >> 10} KiB") from e
            raise
        problem = body_problem(body) if body.strip() else None
    if problem is not None:
        raise ApiError(400, f"invalid request: {problem}")
