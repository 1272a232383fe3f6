"""Who may call envd and as whom: access token, signed /files URLs, Basic-auth user."""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Mapping

from envd.connect import RpcError
from envd.httpserver import HttpError, Request
from envd.state import State
from envd.users import User, lookup

TOKEN_HEADER = "x-access-token"
SIGNING_READ = "read"
SIGNING_WRITE = "write"
UNAUTHORIZED = (
    "unauthorized access, please provide a valid access token or method signing if supported"
)


def same_secret(a: str, b: str) -> bool:
    """Constant-time string comparison (hmac is imported lazily: it drags in OpenSSL)."""
    import hmac

    return hmac.compare_digest(a.encode(), b.encode())


def token_ok(state: State, req: Request) -> bool:
    """True when no token is configured or the request carries the right one."""
    if state.access_token is None:
        return True
    given = req.headers.get(TOKEN_HEADER)
    return given is not None and same_secret(given, state.access_token)


def signature(path: str, operation: str, username: str, token: str, expiration: int | None) -> str:
    """v1 signature of a /files URL, as `e2b.sandbox.signature.get_signature` computes it."""
    raw = f"{path}:{operation}:{username}:{token}"
    if expiration is not None:
        raw += f":{expiration}"
    import hashlib

    digest = hashlib.sha256(raw.encode()).digest()
    return "v1_" + base64.b64encode(digest).decode().rstrip("=")


def check_files_access(state: State, req: Request, operation: str) -> None:
    """/files accepts the token header or a signature over path, operation, user, expiry."""
    check_signing(
        state.access_token, req.headers.get(TOKEN_HEADER), req.query, operation, int(time.time())
    )


def check_signing(
    token: str | None, header: str | None, query: Mapping[str, str], operation: str, now: int
) -> None:
    """Raise envd's refusal of a /files request (`operation` read or write) at unix time
    `now`, as E2B's envd decides (infra `packages/envd/internal/api/auth.go`,
    `validateSigning`): a malformed expiry is a 400 before anything else (it fails to bind
    as a parameter); with no token set anyone may; a token header (an empty one is none)
    must match; otherwise the signature must, and only then is its expiry looked at, so a
    wrong signature says "invalid signature" however old it is."""
    expiration = signature_expiration(query.get("signature_expiration"))
    if token is None:
        return
    if header:
        if not same_secret(header, token):
            raise HttpError(401, "access token present in header but does not match")
        return
    given = query.get("signature")
    if given is None:
        raise HttpError(401, "missing signature query parameter")
    path, username = query.get("path", ""), query.get("username", "")
    expected = signature(path, operation, username, token, expiration)
    if not same_secret(expected, given):
        raise HttpError(401, "invalid signature")
    if expiration is not None and expiration < now:
        raise HttpError(401, "signature is already expired")


def signature_expiration(raw: str | None) -> int | None:
    """The `signature_expiration` parameter as envd binds it (Go's `strconv.ParseInt(raw,
    10, 64)`), or a 400 in the words of its generated router, as plain text."""
    if raw is None:
        return None
    digits = raw[1:] if raw[:1] in ("+", "-") else raw  # all base 10 ParseInt takes
    if not (digits.isascii() and digits.isdigit()):
        reason = "invalid syntax"
    elif -(2**63) <= (value := int(raw)) < 2**63:
        return value
    else:
        reason = "value out of range"
    quoted = json.dumps(raw, ensure_ascii=False)
    raise HttpError(
        400,
        "Invalid format for parameter signature_expiration: error binding string parameter: "
        f"strconv.ParseInt: parsing {quoted}: {reason}",
        plain=True,
    )


def basic_username(header: str | None) -> str | None:
    """The user name in `Authorization: Basic base64("<name>:")`, or None."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=False).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    name = decoded.split(":", 1)[0]
    return name or None


def rpc_user(state: State, headers: dict[str, str]) -> User:
    """The user an RPC acts as; unknown names are `unauthenticated`, as in envd."""
    name = basic_username(headers.get("authorization"))
    if name is None:
        return state.default_user
    try:
        return lookup(name)
    except KeyError as e:
        raise RpcError("unauthenticated", f"invalid username: '{name}'") from e


def http_user(state: State, username: str | None) -> User:
    """The user of a /files call (`username` query), 401 when unknown."""
    if not username:
        return state.default_user
    try:
        return lookup(username)
    except KeyError as e:
        raise HttpError(401, f"invalid username: '{username}'") from e
