"""Access token, /files signatures and Basic-auth user names (pure)."""

from __future__ import annotations

import base64

import pytest
from e2b.sandbox.signature import get_signature

from envd import auth
from envd.files import wants_gzip
from envd.guest_init import parse_timestamp


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
