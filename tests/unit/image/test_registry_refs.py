"""Image references are named the way Docker names them (pure: no registry involved)."""

from __future__ import annotations

import pytest

from shared.images import InvalidImageReference, mirrored, parse_mirrors
from workers.node.image.errors import ImageError
from workers.node.image.registry import parse_reference


@pytest.mark.parametrize(
    ("text", "expected", "loopback"),
    [
        ("busybox", "docker.io/library/busybox:latest", False),
        ("busybox:1.36", "docker.io/library/busybox:1.36", False),
        ("library/python:3.12-slim", "docker.io/library/python:3.12-slim", False),
        ("e2bdev/base", "docker.io/e2bdev/base:latest", False),
        ("index.docker.io/library/alpine:3", "docker.io/library/alpine:3", False),
        ("ghcr.io/e2b-dev/base:v1", "ghcr.io/e2b-dev/base:v1", False),
        ("quay.io/a/b/c", "quay.io/a/b/c:latest", False),
        ("localhost/x", "localhost/x:latest", True),
        ("127.0.0.1:5000/team/img:2", "127.0.0.1:5000/team/img:2", True),
        ("alpine@sha256:" + "a" * 64, "docker.io/library/alpine@sha256:" + "a" * 64, False),
    ],
)
def test_references_are_normalised_as_docker_does(text: str, expected: str, loopback: bool) -> None:
    ref = parse_reference(text)
    assert str(ref) == expected
    assert ref.transport == f"docker://{expected}"
    assert ref.loopback is loopback


@pytest.mark.parametrize(
    "text", ["", "UPPER/case", "a b", "http://x/y", "x:bad tag", "img@sha256:short", "a//b"]
)
def test_bad_references_are_refused_with_the_reference_named(text: str) -> None:
    with pytest.raises(ImageError, match="invalid image reference"):
        parse_reference(text)


def test_a_mirrored_registry_is_pulled_from_its_mirror_only() -> None:
    mirrors = parse_mirrors(" index.docker.io=127.0.0.1:5000 , ghcr.io=[::1]:80,")
    assert mirrors == {"docker.io": "127.0.0.1:5000", "ghcr.io": "[::1]:80"}
    hub = mirrored(parse_reference("python:3.12"), mirrors)
    assert str(hub) == "127.0.0.1:5000/library/python:3.12" and hub.loopback
    pinned = mirrored(parse_reference("ghcr.io/a/b@sha256:" + "c" * 64), mirrors)
    assert str(pinned) == "[::1]:80/a/b@sha256:" + "c" * 64
    other = parse_reference("quay.io/a/b:1")
    assert mirrored(other, mirrors) is other
    assert parse_mirrors("") == {}


@pytest.mark.parametrize("text", ["docker.io", "docker.io=", "=x", "a=b c", "a=http://b"])
def test_bad_mirror_settings_are_refused(text: str) -> None:
    with pytest.raises(InvalidImageReference, match="bad registry mirror"):
        parse_mirrors(text)
