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
from litestar.openapi import ResponseSpec
from nats.errors import Error as NatsError
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from api.wire import Error
from bus.errors import PublishError
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
    return Response(
        content=error_body(status, message),
        status_code=status,
        headers=headers,
        media_type="application/json",
    )


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


#: What a client is told to wait before it retries a request cut by a fault of ours.
TRANSIENT_RETRY_S = 2


#: SQLSTATE classes of a database that is down or coming back, not of a bad query: 08
#: connection exception, 57 operator intervention (57P01 shut down, 57P02 crashed,
#: 57P03 "the database system is in recovery mode" right after a kill -9 restart)
_OUTAGE_SQLSTATES = frozenset({"08", "57"})


def _transient(exc: Exception) -> str | None:
    """What of ours was not answering, if `exc` is an outage rather than a bug: the bus
    (a NATS server restarting, a JetStream leader being elected — its requests time out
    for a few seconds) or the read-model database. Retrying later is the client's move,
    which a 503 with Retry-After says; a 500 said "bug". (A command cut this way may still
    have been stored, as after any timeout: the listing shows what happened.)"""
    if isinstance(exc, NatsError | PublishError):
        return "the message bus"
    lost = isinstance(exc, DBAPIError) and (
        exc.connection_invalidated
        or isinstance(exc.orig, OSError)
        or str(getattr(exc.orig, "sqlstate", None) or "")[:2] in _OUTAGE_SQLSTATES
    )
    if lost or isinstance(exc, OperationalError | InterfaceError):
        return "the read-model database"
    if isinstance(exc, ConnectionError):
        return "a service of ours"
    return None


def on_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    if (what := _transient(exc)) is not None:
        log.warning(
            "%s %s: %s is not answering (%r); 503", request.method, request.url.path, what, exc
        )
        return _response(
            503,
            f"{what} is not answering right now ({type(exc).__name__}); "
            f"retry in {TRANSIENT_RETRY_S} s",
            {"Retry-After": str(TRANSIENT_RETRY_S)},
        )
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return _response(500, f"internal error ({type(exc).__name__})")


HANDLERS: dict[Any, Any] = {
    ApiError: on_api_error,
    DomainError: on_domain_error,
    ValidationException: on_validation,
    HTTPException: on_http,
    Exception: on_unexpected,
}


#: What each error status means, for the OpenAPI document.
_MEANING = {
    400: "Invalid request: a bad parameter or body field, a NUL byte, JSON nested too deep",
    401: "Missing or invalid API key (X-API-KEY)",
    403: "Invalid or missing upload token; or a template another team built; or a node "
    "route called with a key that is not an operator's",
    404: "No such sandbox, template or build (an id outside the id alphabet names none)",
    409: "The request conflicts with the current state",
    429: "The team is at its limit of running sandboxes or of sandboxes started per second "
    "(the message says which, its value and where it is set): retry after Retry-After "
    "seconds",
    413: "Request body too large",
    500: "Internal error",
    501: "Not configured on this server",
    503: "No node can take it now (none has room, or the one holding the sandbox is not "
    "running), or the message bus or database is failing over: retry after "
    "Retry-After seconds",
    504: "The command did not finish in time; it continues in the background",
}
#: What any authenticated route may answer, whatever it does.
COMMON = (400, 401, 404, 409, 413, 500, 503, 504)


def documented(*statuses: int) -> dict[int, ResponseSpec]:
    """OpenAPI `responses` of a route: each error status with the body it really has
    (Litestar's default documents `{status_code, detail}`, which we never send)."""
    return {
        status: ResponseSpec(
            data_container=Error, description=_MEANING[status], generate_examples=False
        )
        for status in statuses or COMMON
    }


ERRORS = documented()
#: What a route that starts sandboxes may answer (create, resume, connect, fork): admission
#: control's 429 too (`api/admission.py`).
ADMITTED = documented(*COMMON, 429)
