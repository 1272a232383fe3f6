"""Pure parts of the template routes: names, the SDK's default base image, wire shapes."""

from __future__ import annotations

import pytest

from api.errors import ApiError
from api.templates import _template_name, base_of
from api.wire_templates import BuildStart


@pytest.mark.parametrize(
    ("raw", "name", "tag"),
    [
        ("my-app", "my-app", None),
        ("My-App:V1.2", "my-app", "v1.2"),
        ("team/my.app_2", "my.app_2", None),
        ("team/app:stable", "app", "stable"),
    ],
)
def test_names_become_ids_and_tags(raw: str, name: str, tag: str | None) -> None:
    assert _template_name(raw) == (name, tag)


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "bad name",
        "-x",
        "base",
        "x" * 200,
        "app:bad tag",
        "app:",
        "app:3f1b9e2a-8a4f-4c1e-9d0b-2f6e1a7c5b3d",
    ],
)
def test_bad_names_are_400(raw: str) -> None:
    with pytest.raises(ApiError) as e:
        _template_name(raw)
    assert e.value.status == 400


def test_the_sdk_default_image_is_our_base_template() -> None:
    assert base_of(BuildStart.model_validate({"fromImage": "e2bdev/base"})) == ("base", None)
    assert base_of(BuildStart.model_validate({"fromTemplate": "x"})) == ("x", None)
    assert base_of(BuildStart.model_validate({"fromImage": "/img.tar"})) == (None, "/img.tar")


def test_build_start_reads_the_sdk_wire_shape() -> None:
    body = {
        "fromTemplate": "base",
        "force": False,
        "startCmd": "s",
        "readyCmd": "r",
        "steps": [
            {
                "type": "COPY",
                "args": ["a", "/b", "", ""],
                "filesHash": "ab12cd34",
                "force": False,
                "forceUpload": None,
            }
        ],
    }
    start = BuildStart.model_validate(body)
    assert start.steps[0].files_hash == "ab12cd34" and start.start_cmd == "s"
