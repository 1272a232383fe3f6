"""An OCI-image template: a two-layer OCI layout (a Debian-shaped tree + a layer of our
own) becomes a guest image, boots under the runtime, and runs commands through envd. The
tree is this Debian host's bash and cat with their glibc (`tests.registry.debian_tree`):
the whole debootstrap tree as an OCI image is e2e_cli's
`test_pull_and_build_from_a_local_oci_archive`, at a minute of unpacking and mkfs."""

from __future__ import annotations

import asyncio
import io
import tarfile
from pathlib import Path

import pytest

from tests.integration.runtime.conftest import sdk
from tests.registry import debian_tree
from tests.support import drop_image
from workers.node.image import build_from_oci, kernel_cmdline
from workers.node.image.oci_write import tar_tree, write_layout
from workers.node.runtime import Runtime

pytestmark = pytest.mark.vm


def marker_layer(text: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = text.encode()
        info = tarfile.TarInfo("etc/aenv-oci-marker")
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def test_oci_template_boots_and_runs_through_envd(runtime: Runtime, tmp_path: Path) -> None:
    tree = await asyncio.to_thread(debian_tree, tmp_path / "tree", "bash", "cat")
    base = await asyncio.to_thread(tar_tree, tree)
    layout = tmp_path / "layout"
    write_layout(layout, [base, marker_layer("from-the-oci-layer\n")])
    image = await asyncio.to_thread(
        build_from_oci, layout, "runtime-oci-test", progress=lambda m: None, force=True
    )
    vm = await runtime.boot(
        kernel=image.kernel,
        initrd=image.initrd,
        rootfs=image.rootfs,
        cmdline=kernel_cmdline(image),
        mem_mib=256,
    )
    try:
        await runtime.wait_envd(vm)
        s = sdk(vm)
        release = await asyncio.to_thread(lambda: s.commands.run("cat /etc/os-release").stdout)
        assert "ID=debian" in release and "bookworm" in release
        marker = await asyncio.to_thread(lambda: s.files.read("/etc/aenv-oci-marker"))
        assert marker == "from-the-oci-layer\n"
    finally:
        await runtime.destroy(vm)
        drop_image(image.digest, "runtime-oci-test")
