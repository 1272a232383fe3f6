"""Who may call envd and as whom: access token, signed /files URLs, Basic-auth user."""

from __future__ import annotations

import base64
import binascii
import time

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
    token = state.access_token
    if token is None:
        return
    given = req.headers.get(TOKEN_HEADER)
    if given is not None:
        if not same_secret(given, token):
            raise HttpError(401, "access token present in header but does not match")
        return
    q = req.query
    sig = q.get("signature")
    if sig is None:
        raise HttpError(401, "missing signature query parameter")
    exp_raw = q.get("signature_expiration")
    exp: int | None = None
    if exp_raw is not None:
        try:
            exp = int(exp_raw)
        except ValueError as e:
            raise HttpError(401, "invalid signature expiration") from e
    expected = signature(q.get("path", ""), operation, q.get("username", ""), token, exp)
    if not same_secret(expected, sig):
        raise HttpError(401, "invalid signature")
    if exp is not None and exp < time.time():
        raise HttpError(401, "signature is already expired")


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
