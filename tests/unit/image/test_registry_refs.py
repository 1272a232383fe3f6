"""Image references are named the way Docker names them (pure: no registry involved)."""

from __future__ import annotations

import pytest

from shared.images import (
    InvalidImageReference,
    image_template_id,
    looks_like_image,
    mirrored,
    parse_mirrors,
)
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


def test_an_image_has_one_template_name_for_the_api_and_the_builder() -> None:
    """`img-` + the hash the builder has always used: a create finds a build's import."""
    assert image_template_id("python:3.12") == "img-a3697db92aaa76c4"
    assert image_template_id("docker.io/library/python:3.12") == "img-a3697db92aaa76c4"
    assert image_template_id("python:3.12", "bob") != "img-a3697db92aaa76c4"
    assert image_template_id("127.0.0.1:5000/cat/a:1").startswith("img-")


@pytest.mark.parametrize(
    ("text", "image"),
    [
        ("127.0.0.1:5000/cat/a:1", True),
        ("docker.io/library/python:3.12", True),
        ("ghcr.io/org/img", True),
        ("busybox@sha256:" + "a" * 64, True),
        ("python:3.12", False),  # a template `python` at tag `3.12`
        ("base", False),
        ("my.tpl", False),
        ("app:0b6f3c1e-9a7e-4f0e-8a59-6d1f1f2b6a11", False),
        ("Bad/Upper", False),
        ("a b/c", False),
    ],
)
def test_a_create_names_an_image_by_a_slash_or_a_digest(text: str, image: bool) -> None:
    assert looks_like_image(text) is image
