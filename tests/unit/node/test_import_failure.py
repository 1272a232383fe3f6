"""A failed import's rejection code: a full node disk is `unavailable` (another node with
room can take it), any other failure the image's (`permanent`)."""

from __future__ import annotations

import asyncio
import errno

import pytest

from workers.node.image.errors import DiskFull, ImageError
from workers.node.imports import import_image
from workers.node.ports import HostError, ImageSource
from workers.node.template_work import import_failure_code


def test_a_full_disk_is_unavailable_anything_else_permanent() -> None:
    assert import_failure_code(HostError("node disk full: x", code="unavailable")) == "unavailable"
    assert import_failure_code(HostError("bad", code="invalid")) == "permanent"
    assert import_failure_code(ImageError("layer 1: corrupt gzip stream")) == "permanent"
    assert import_failure_code(OSError(errno.ENOSPC, "No space left on device")) == "permanent"


def test_disk_full_becomes_a_host_error_the_worker_answers_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def full(*_a: object, **_k: object) -> None:
        raise DiskFull("node disk full: import of x in /c: No space left on device")

    monkeypatch.setattr("workers.node.imports.convert_image", full)
    with pytest.raises(HostError) as failed:
        asyncio.run(import_image("x", ImageSource(path="/nowhere"), None))
    assert failed.value.code == "unavailable"
    assert import_failure_code(failed.value) == "unavailable"
    assert str(failed.value).startswith("node disk full: ")


def test_a_full_disk_while_fetching_is_unavailable_too(monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*_a: object, **_k: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("workers.node.imports.convert_image", full)
    with pytest.raises(HostError) as failed:
        asyncio.run(import_image("x", ImageSource(path="/nowhere"), None))
    assert failed.value.code == "unavailable"
    assert str(failed.value).startswith("node disk full: import of x in ")


def test_other_failures_pass_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    def bad(*_a: object, **_k: object) -> None:
        raise ImageError("layer 1: corrupt gzip stream")

    monkeypatch.setattr("workers.node.imports.convert_image", bad)
    with pytest.raises(ImageError, match="corrupt gzip"):
        asyncio.run(import_image("x", ImageSource(path="/nowhere"), None))
