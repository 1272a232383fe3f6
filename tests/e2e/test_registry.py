"""Templates from registry images through the unchanged e2b SDK, against real registries on
loopback (`docker-registry`, open and behind basic auth) holding images the test makes and
pushes itself: a busybox-only image (no libc, no Python, no bash) is a sandbox; a private
registry needs the right login, and a wrong one fails the build saying so; an image sharing
a base layer with one pulled before downloads only its own layer."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from e2b import BuildException, Sandbox, Template

from tests.e2e.conftest import Stack
from tests.registry import busybox_tree, layout, local_registry, push

pytestmark = pytest.mark.vm


def _build(image: str, name: str, **login: str) -> list[str]:
    logs: list[str] = []
    Template.build(
        Template().from_image(image, **login), name, on_build_logs=lambda e: logs.append(e.message)
    )
    return logs


def test_registry_images_become_sandboxes(stack: Stack, tmp_path: Path) -> None:
    base = busybox_tree(tmp_path / "base")
    extra = tmp_path / "extra"
    (extra / "srv").mkdir(parents=True)
    (extra / "srv/data.txt").write_text("second layer\n")
    tag = uuid.uuid4().hex[:8]
    with (
        local_registry(tmp_path / "open") as open_reg,
        local_registry(tmp_path / "private", login=("aenv", "s3cret")) as private,
    ):
        own = tmp_path / "own"
        (own / "srv").mkdir(parents=True)
        (own / "srv/one.txt").write_text("its own layer\n")
        one = push(layout(tmp_path / "one", base, own), open_reg, "tests/busybox", tag)
        config = {
            "config": {
                "Env": ["IMAGE_GREETING=hello"],
                "User": "0",
                "WorkingDir": "/srv",
                "Cmd": ["/bin/false"],
            }
        }
        two = push(
            layout(tmp_path / "two", base, extra, config=config),
            open_reg,
            "tests/busybox-plus",
            tag,
        )
        secret = push(layout(tmp_path / "secret", base), private, "tests/private", tag)

        name = f"reg-{tag}"
        first = _build(one, name)
        sbx = Sandbox.create(name)
        try:
            out = sbx.commands.run("echo hi from $(uname -s); id -un").stdout
            assert out == "hi from Linux\nuser\n"
            sbx.files.write("/home/user/f.txt", "through envd")
            assert sbx.files.read("/home/user/f.txt") == "through envd"
        finally:
            sbx.kill()
        assert any("2 layers, 0 already in the layer cache" in m for m in first), first

        # the second image shares the first's base layer, which the first import kept (its
        # own layer's blob and whole-stack chain it dropped: `leftovers.finished`): only
        # the second's own layer is downloaded
        logs = _build(two, f"{name}-plus")
        assert any("2 layers, 1 already in the layer cache" in m for m in logs), logs
        assert any("layers 0-0 already unpacked" in m for m in logs), logs  # nor unpacked
        plus = Sandbox.create(f"{name}-plus")
        try:  # the image's ENV, USER and WORKDIR are the template's defaults; CMD is not run
            out = plus.commands.run("pwd; echo $IMAGE_GREETING; id -un; cat data.txt").stdout
            assert out == "/srv\nhello\nroot\nsecond layer\n"
        finally:
            plus.kill()

        with pytest.raises(BuildException, match="refused the credentials"):
            _build(secret, f"{name}-bad", username="aenv", password="wrong")
        _build(secret, f"{name}-private", username="aenv", password="s3cret")
        assert Template.exists(f"{name}-private")
    for t in (name, f"{name}-plus", f"{name}-private"):
        Sandbox.delete_snapshot(t)
