"""Image references are named the way Docker names them (pure: no registry involved)."""

from __future__ import annotations

import pytest

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
def test_references_are_normalised_as_docker_does(
    text: str, expected: str, loopback: bool
) -> None:
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
