"""API errors and their one wire shape: E2B's `{"code": int, "message": str}`.

Only this package maps errors to HTTP (conventions rule 9). Every handler raises `ApiError`
or lets a domain/bus error through; the exception handlers here turn each into JSON with
the right status, so the SDK's generated parser never sees a body it cannot read.
"""

from __future__ import annotations

import logging
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException

from domain import Conflict, DomainError, Invalid, NotFound

log = logging.getLogger(__name__)


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"code": status, "message": message}


def _response(status: int, message: str, headers: dict[str, str] | None = None) -> Response[Any]:
    return Response(content=error_body(status, message), status_code=status, headers=headers,
                    media_type="application/json")  # fmt: skip


def on_api_error(_: Request[Any, Any, Any], exc: ApiError) -> Response[Any]:
    return _response(exc.status, exc.message, exc.headers)


def on_domain_error(_: Request[Any, Any, Any], exc: DomainError) -> Response[Any]:
    status = {NotFound: 404, Conflict: 409, Invalid: 400}.get(type(exc), 400)
    return _response(status, str(exc))


def on_validation(_: Request[Any, Any, Any], exc: ValidationException) -> Response[Any]:
    extra = exc.extra if isinstance(exc.extra, list) else []
    details = "; ".join(
        f"{e.get('key', '')}: {e.get('message', '')}".strip(": ")
        for e in extra
        if isinstance(e, dict)
    )
    return _response(400, f"invalid request: {details or exc.detail}")


def on_http(_: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    return _response(exc.status_code, str(exc.detail), dict(exc.headers or {}))


def on_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return _response(500, f"internal error ({type(exc).__name__})")


HANDLERS: dict[Any, Any] = {
    ApiError: on_api_error,
    DomainError: on_domain_error,
    ValidationException: on_validation,
    HTTPException: on_http,
    Exception: on_unexpected,
}
