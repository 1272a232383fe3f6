"""Which sandbox port a request names by its Host (`shared.proxy.hosts`): E2B's
`{port}-{sandboxId}.{domain}`, the API at `api.{domain}`, and a domain that carries the
TLS port as clients are given it (`E2B_DOMAIN=aenv.localhost:8443`)."""

from __future__ import annotations

import pytest

from shared.proxy import host_label, sandbox_target, stray_host


def scope(host: str, **headers: str) -> dict[str, object]:
    pairs = [(b"host", host.encode())]
    pairs += [(k.replace("_", "-").lower().encode(), v.encode()) for k, v in headers.items()]
    return {"type": "http", "headers": pairs}


@pytest.mark.parametrize("domain", ["aenv.localhost:8443", "aenv.localhost", "AENV.localhost."])
@pytest.mark.parametrize(
    ("host", "target"),
    [
        ("49983-abc123.aenv.localhost:8443", ("abc123", 49983)),
        ("8000-abc123.aenv.localhost", ("abc123", 8000)),  # the plain port's Host: no port
        ("8000-abc123.aenv.localhost:3000", ("abc123", 8000)),  # another port: same name
        ("8000-ABC123.Aenv.Localhost:8443", ("abc123", 8000)),  # DNS ignores case
        ("8000-abc123.aenv.localhost.:8443", ("abc123", 8000)),  # a fully qualified name
        ("api.aenv.localhost:8443", None),
        ("aenv.localhost:8443", None),
        ("8000-abc123.other.localhost:8443", None),
        ("8000-abc123.xaenv.localhost:8443", None),  # not under the domain: a longer label
        ("127.0.0.1:3000", None),
        ("[::1]:3000", None),
        ("65536-abc123.aenv.localhost", None),  # no such port
        ("0-abc123.aenv.localhost", None),
        ("8000-abc_123.aenv.localhost", None),  # not infra's id alphabet
        ("x.8000-abc123.aenv.localhost", None),  # one label only
        # e2b 1.3.3 names a sandbox `{sandboxID}-{clientID}`: E2B's proxy keeps the first
        ("49983-abc123-aenv.aenv.localhost:8443", ("abc123", 49983)),
        ("8000-abc123-6532622b.aenv.localhost", ("abc123", 8000)),
        ("8000-abc123-x-y.aenv.localhost", None),  # one client id at most
        ("8000-abc123-.aenv.localhost", None),
    ],
)
def test_a_sandbox_port_by_host_name(domain: str, host: str, target: object) -> None:
    assert sandbox_target(scope(host), domain) == target


def test_the_headers_win_over_the_host() -> None:
    """`E2B_SANDBOX_URL` clients send both; the headers are what E2B's proxy reads first."""
    s = scope("8000-abc.aenv.localhost", e2b_sandbox_id="xyz", e2b_sandbox_port="49983")
    assert sandbox_target(s, "aenv.localhost") == ("xyz", 49983)


def test_no_domain_no_host_routing() -> None:
    assert sandbox_target(scope("8000-abc.aenv.localhost"), None) is None


@pytest.mark.parametrize(
    ("host", "stray"),
    [
        ("www.aenv.localhost:8443", True),
        ("abc.aenv.localhost", True),
        ("99999-abc.aenv.localhost", True),
        ("a.b.aenv.localhost", True),
        ("api.aenv.localhost:8443", False),  # the control plane
        ("49983-abc.aenv.localhost", False),  # a sandbox
        ("aenv.localhost:8443", False),  # the domain itself: the control plane
        ("127.0.0.1:3000", False),  # not ours to judge
        ("example.com", False),
    ],
)
def test_a_name_under_the_domain_that_names_nothing_is_stray(host: str, stray: bool) -> None:
    assert (stray_host(scope(host), "aenv.localhost:8443") == host) is stray
    assert stray_host(scope(host), None) is None


def test_host_label_leaves_ports_out() -> None:
    assert host_label("8000-a.x.y:1", "x.y:2") == "8000-a"
    assert host_label("x.y", "x.y") is None
    assert host_label("ax.y", "x.y") is None
