"""Access token, /files signatures and Basic-auth user names (pure)."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest
from e2b.sandbox.signature import get_signature

from envd import auth
from envd.files import wants_gzip
from envd.guest_init import parse_timestamp
from envd.httpserver import HttpError


@pytest.mark.parametrize("user", [None, "user", "root"])
@pytest.mark.parametrize("expiration", [None, 3600])
def test_signature_matches_the_sdk(user: str | None, expiration: int | None) -> None:
    sdk = get_signature("/home/user/a b.txt", "read", user, "tok", expiration)
    ours = auth.signature("/home/user/a b.txt", "read", user or "", "tok", sdk["expiration"])
    assert ours == sdk["signature"]


def test_signature_binds_operation_and_token() -> None:
    base = auth.signature("p", "read", "", "t", None)
    assert auth.signature("p", "write", "", "t", None) != base
    assert auth.signature("p", "read", "", "t2", None) != base
    assert base.startswith("v1_") and not base.endswith("=")


NOW = 1_800_000_000


def _signed(
    operation: str = "read", user: str | None = None, expiration: int | None = None
) -> dict[str, str]:
    """A /files query as `download_url`/`upload_url` build it, signed by the SDK's code."""
    sig = get_signature("/home/user/f.txt", operation, user, "tok", None)["signature"]
    query = {"path": "/home/user/f.txt"}
    if user:
        query["username"] = user
    if expiration is not None:
        raw = f"/home/user/f.txt:{operation}:{user or ''}:tok:{expiration}"
        sig = "v1_" + base64.b64encode(hashlib.sha256(raw.encode()).digest()).decode().rstrip("=")
        query["signature_expiration"] = str(expiration)
    return query | {"signature": sig}


def _refusal(
    query: dict[str, str], operation: str = "read", header: str | None = None
) -> tuple[int, str] | None:
    try:
        auth.check_signing("tok", header, query, operation, NOW)
    except HttpError as e:
        return e.status, e.message
    return None


@pytest.mark.parametrize("user", [None, "user", "root"])
@pytest.mark.parametrize("operation", ["read", "write"])
@pytest.mark.parametrize("expiration", [None, NOW, NOW + 120])
def test_a_signed_url_is_let_through(
    user: str | None, operation: str, expiration: int | None
) -> None:
    assert _refusal(_signed(operation, user, expiration), operation) is None


EXPIRED = (401, "signature is already expired")
INVALID = (401, "invalid signature")


@pytest.mark.parametrize(
    ("query", "operation", "refusal"),
    [
        (_signed(expiration=NOW - 1), "read", EXPIRED),
        (_signed("write", "root", NOW - 3600), "write", EXPIRED),
        (_signed(), "write", INVALID),  # a read signature does not write
        (_signed() | {"path": "/root/f.txt"}, "read", INVALID),
        (_signed() | {"username": "root"}, "read", INVALID),
        (_signed("read", "root") | {"username": ""}, "read", INVALID),
        (_signed(expiration=NOW) | {"signature_expiration": str(NOW + 60)}, "read", INVALID),
        # the signature is checked first: a wrong one is "invalid" however old
        (_signed(expiration=NOW) | {"signature_expiration": str(NOW - 60)}, "read", INVALID),
        (_signed() | {"signature_expiration": str(NOW + 60)}, "read", INVALID),
        (_signed() | {"signature": "v1_" + "A" * 43}, "read", INVALID),
        (_signed() | {"signature": ""}, "read", INVALID),
        ({"path": "/home/user/f.txt"}, "read", (401, "missing signature query parameter")),
    ],
)
def test_refusals_are_e2b_envds(
    query: dict[str, str], operation: str, refusal: tuple[int, str]
) -> None:
    assert _refusal(query, operation) == refusal


def test_the_token_header_stands_for_a_signature() -> None:
    assert _refusal({"path": "x"}, header="tok") is None
    assert _refusal(_signed(), header="nope") == (
        401,
        "access token present in header but does not match",
    )
    # an empty header is no header (Go's `!= ""`): the signature decides
    assert _refusal(_signed(), header="") is None
    assert _refusal({"path": "x"}, header="") == (401, "missing signature query parameter")


def test_without_a_token_anyone_may() -> None:
    auth.check_signing(None, None, {"path": "x"}, "write", NOW)
    auth.check_signing(None, None, {"signature": "v1_wrong"}, "read", NOW)


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        (None, None),
        ("0", 0),
        ("120", 120),
        ("+120", 120),
        ("-120", -120),
        (str(2**63 - 1), 2**63 - 1),
    ],
)
def test_signature_expiration_parses_as_go_does(raw: str | None, value: int | None) -> None:
    assert auth.signature_expiration(raw) == value


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("soon", "invalid syntax"),
        ("", "invalid syntax"),
        ("-", "invalid syntax"),
        ("1_000", "invalid syntax"),
        (" 12", "invalid syntax"),
        ("1.5", "invalid syntax"),
        ("\u0663", "invalid syntax"),  # a digit, but not an ASCII one
        (str(2**63), "value out of range"),
        (str(-(2**63) - 1), "value out of range"),
    ],
)
def test_an_unparsable_expiration_is_the_routers_400(raw: str, reason: str) -> None:
    with pytest.raises(HttpError) as e:
        auth.check_signing(None, None, {"signature_expiration": raw}, "read", NOW)
    assert (e.value.status, e.value.plain) == (400, True)
    assert e.value.message == (
        "Invalid format for parameter signature_expiration: error binding string parameter: "
        f"strconv.ParseInt: parsing {json.dumps(raw, ensure_ascii=False)}: {reason}"
    )


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("Basic " + base64.b64encode(b"user:").decode(), "user"),
        ("basic " + base64.b64encode(b"root:").decode(), "root"),
        ("Basic " + base64.b64encode(b"alice:secret").decode(), "alice"),
        ("Bearer abc", None),
        ("Basic !!!", None),
        (None, None),
        ("Basic " + base64.b64encode(b":").decode(), None),
    ],
)
def test_basic_username(header: str | None, name: str | None) -> None:
    assert auth.basic_username(header) == name


def test_same_secret() -> None:
    assert auth.same_secret("abc", "abc")
    assert not auth.same_secret("abc", "abd")


@pytest.mark.parametrize(
    ("value", "ns"),
    [
        (1_700_000_000_123_456_789, 1_700_000_000_123_456_789),
        ("1700000000123456789", 1_700_000_000_123_456_789),
        ("2023-11-14T22:13:20Z", 1_700_000_000_000_000_000),
        ("2023-11-14T22:13:20.123456789Z", 1_700_000_000_123_456_789),
        ("2023-11-14T23:13:20.5+01:00", 1_700_000_000_500_000_000),
        # what the node worker sends: datetime.now(UTC).isoformat()
        ("2023-11-14T22:13:20.123456+00:00", 1_700_000_000_123_456_000),
        (None, None),
    ],
)
def test_parse_timestamp(value: object, ns: int | None) -> None:
    assert parse_timestamp(value) == ns


def test_parse_timestamp_rejects_garbage() -> None:
    for bad in ("yesterday", True, 1.5, [1]):
        with pytest.raises(ValueError):
            parse_timestamp(bad)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("gzip", True),
        ("gzip, deflate", False),
        ("", False),
        ("identity", False),
        ("gzip;q=0", False),
        ("gzip, identity", True),
        ("br", False),
    ],
)
def test_wants_gzip(header: str, expected: bool) -> None:
    assert wants_gzip(header) is expected
