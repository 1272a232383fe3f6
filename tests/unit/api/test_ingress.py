"""The traffic-token decision of the sandbox proxy (`shared.proxy.ingress`), pure."""

from __future__ import annotations

from bus.routes import traffic_digest
from shared.proxy.ingress import ENVD_PORT, presented_token, refusal

DIGEST = traffic_digest("s3cret")
MISSING = (
    "Sandbox is secured with traffic access token. "
    "Token header 'e2b-traffic-access-token' is missing"
)
INVALID = (
    "Sandbox is secured with traffic access token. "
    "Provided token in header 'e2b-traffic-access-token' is invalid"
)


def test_a_public_sandbox_lets_everyone_in() -> None:
    assert refusal(None, 8000, None) is None
    assert refusal(None, 8000, "anything") is None


def test_a_private_sandbox_wants_its_token_on_guest_ports() -> None:
    assert refusal(DIGEST, 8000, "s3cret") is None
    assert refusal(DIGEST, 8000, None) == MISSING
    assert refusal(DIGEST, 8000, "") == MISSING  # E2B: an empty header is a missing one
    assert refusal(DIGEST, 8000, "s3cre") == INVALID
    assert refusal(DIGEST, 8000, "s3cret ") == INVALID
    assert refusal(DIGEST, 8000, DIGEST) == INVALID  # the digest is not the token


def test_envds_port_is_left_to_envd() -> None:
    assert ENVD_PORT == 49983
    assert refusal(DIGEST, ENVD_PORT, None) is None
    assert refusal(DIGEST, ENVD_PORT, "wrong") is None


def test_the_token_is_read_from_its_header() -> None:
    scope = {"headers": [(b"host", b"x"), (b"e2b-traffic-access-token", b"tok")]}
    assert presented_token(scope) == "tok"
    assert presented_token({"headers": [(b"x-access-token", b"tok")]}) is None
