"""Boot images under QEMU microvm (TCG) and watch the serial console for the markers."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from aenv.stack.process import free_port
from shared.diskdigest import chunk_list
from tests.support import drop_image
from workers.node.image import (
    GuestImage,
    base_rootfs_tree,
    build_base,
    build_from_oci,
    build_runtime,
    cache_root,
)
from workers.node.image.build import default_envd_src
from workers.node.image.content import recipe_of, recorded_content
from workers.node.image.disk import DEFAULT_FREE
from workers.node.image.oci_write import write_archive, write_layout_from_dir

from .qemu_boot import boot

pytestmark = [pytest.mark.vm, pytest.mark.slow, pytest.mark.timeout(600)]


def test_two_builds_of_one_base_are_one_cache_entry(base_image: GuestImage) -> None:
    """The cache is keyed by bytes (issue 40, S3): the entry is named by the chunk-list
    digest recomputed from its disk, and a second build of the recipe finds that entry."""
    again = build_base(progress=lambda m: None)
    assert again.digest == base_image.digest and again.rootfs == base_image.rootfs
    entry = base_image.rootfs.parent
    assert entry.parent == cache_root() / "images"
    assert entry.name == base_image.content_digest == chunk_list(base_image.rootfs).digest
    same_recipe = [
        d for d in entry.parent.iterdir() if recipe_of(d / "root.ext4") == base_image.digest
    ]
    assert same_recipe == [entry]


def test_base_image_boots_to_init_and_envd(base_image: GuestImage) -> None:
    assert base_image.kernel.stat().st_size > 10 << 20  # the uncompressed PVH vmlinux
    assert base_image.manifest["guest"]["ip"] == "169.254.0.21/30"
    with boot(base_image) as vm:
        m, t_init = vm.wait_for(r"AENV-INIT (\d+\.\d+)", timeout=90)
        print(f"AENV-INIT after {t_init:.2f}s wall (guest uptime {m.group(1)}s)")
        console = vm.console()
        for marker in ("start", "modules-loaded", "root-mounted", "switch-root"):
            assert f"] {marker}" in console, console  # vmdebug=1 progress markers
        if (default_envd_src() / "__main__.py").exists():
            m, t_envd = vm.wait_for(r"ENVD-READY 49983|AENV-ENVD-EXIT \d+", timeout=60)
            print(f"{m.group(0)} after {t_envd:.2f}s wall")
            assert m.group(0) == "ENVD-READY 49983", vm.console()
        proc = vm.proc
    assert proc.poll() is not None  # killed on exit


def test_network_knobs_configure_eth0_and_envd_answers(base_image: GuestImage) -> None:
    if not (default_envd_src() / "__main__.py").exists():
        pytest.skip("envd has no entry point yet")
    port = free_port()
    with boot(base_image, forward_port=port) as vm:
        vm.wait_for(r"ENVD-READY 49983", timeout=120)
        assert "net-up" in vm.console()
        # slirp forwards to 10.0.2.15 only: an answer proves vmip/vmgw set up eth0
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    status = r.status
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        assert 200 <= status < 300


def test_initramfs_failure_powers_off_with_a_reason(base_image: GuestImage) -> None:
    with boot(base_image, extra={"vminit": "/no/such/init"}) as vm:
        try:
            vm.wait_for("never printed", timeout=90)
        except AssertionError as e:
            assert "AENV-INIT-FAIL root filesystem has no /no/such/init" in str(e)
        else:  # pragma: no cover
            pytest.fail("boot did not fail")
        # poweroff -f ends QEMU by itself: the host driver sees the exit, not a hang
        deadline = time.monotonic() + 30
        while vm.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert vm.proc.returncode == 0, "QEMU did not exit after AENV-INIT-FAIL"


def test_an_envd_change_rebuilds_the_runtime_not_the_image(
    base_image: GuestImage, tmp_path: Path
) -> None:
    """envd lives on its own runtime disk: changing it makes a new runtime (seconds, no
    debootstrap) and leaves every guest image as it is."""
    envd = tmp_path / "envd"
    shutil.copytree(default_envd_src(), envd, ignore=shutil.ignore_patterns("__pycache__"))
    (envd / "_aenv_image_test_marker.py").write_text("MARKER = 1\n")
    messages: list[str] = []
    t0 = time.monotonic()
    runtime = build_runtime(progress=messages.append, envd_src=envd)
    elapsed = time.monotonic() - t0
    assert runtime.digest != build_runtime(progress=lambda m: None).digest
    assert not any("debootstrap --variant" in m for m in messages), messages
    assert build_base(progress=lambda m: None).digest == base_image.digest
    # the base tree is read, never written
    tree = base_rootfs_tree()
    assert "user:" not in (tree / "etc/passwd").read_text()
    assert not (tree / "opt/aenv").exists()
    print(f"runtime with a changed envd: {elapsed:.1f}s")
    again: list[str] = []
    assert build_runtime(progress=again.append, envd_src=envd).digest == runtime.digest
    assert again == []  # a cache hit builds nothing
    # what the disk is, recorded at build time: the chunk list of its bytes
    assert runtime.content_digest == chunk_list(runtime.path).digest
    # with a stamp that still holds once published: no capture hashes it again
    assert recorded_content(runtime.path) == runtime.content_digest
    with boot(base_image, runtime=runtime) as vm:  # the image runs on either runtime
        m, _ = vm.wait_for(r"ENVD-READY 49983|AENV-ENVD-EXIT \d+", timeout=90)
        assert m.group(0) == "ENVD-READY 49983", vm.console()
    drop_image(f"runtime-{runtime.digest}")  # keep the shared cache lean: test-only


def test_an_image_with_no_libc_and_no_python_runs_envd(tmp_path: Path) -> None:
    """A busybox-only image (static: no libc, no loader, no Python): envd runs anyway, on
    its own runtime, and PID 1 and the user's shell come from what is there."""
    from tests.registry import busybox_tree, layout

    image = layout(tmp_path / "layout", busybox_tree(tmp_path / "tree"))
    img = build_from_oci(image, "busybox-test", progress=lambda m: None, force=True)
    try:
        assert img.manifest["guest"]["python"] is None
        # a tiny image still keeps the node's free space; its content digest is its bytes'
        assert img.rootfs.stat().st_size >= DEFAULT_FREE
        assert img.content_digest == chunk_list(img.rootfs).digest
        assert recorded_content(img.rootfs) == img.content_digest  # its stamp holds
        port = free_port()
        with boot(img, forward_port=port) as vm:
            m, _ = vm.wait_for(r"ENVD-READY 49983|AENV-ENVD-EXIT \d+", timeout=120)
            assert m.group(0) == "ENVD-READY 49983", vm.console()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30) as r:
                assert 200 <= r.status < 300
    finally:
        drop_image(img.digest, "busybox-test")


def test_an_oci_archive_of_a_debian_tree_boots(base_image: GuestImage, tmp_path: Path) -> None:
    """A tree written as an OCI layout, then an archive (`docker save`'s shape), becomes an
    image of its own that boots to init and envd. A small Debian-shaped tree (bash and
    its glibc): the whole debootstrap tree through an archive is e2e_cli's
    `test_pull_and_build_from_a_local_oci_archive` (`aenv pull`, `FROM ./bookworm.tar`)."""
    from tests.registry import debian_tree

    tree = debian_tree(tmp_path / "tree", "bash", "cat")
    layout = tmp_path / "layout"
    t0 = time.monotonic()
    write_layout_from_dir(tree, layout)
    archive = tmp_path / "image.tar"
    write_archive(layout, archive)
    print(f"OCI layout + archive of the tree: {time.monotonic() - t0:.1f}s")
    messages: list[str] = []
    img = build_from_oci(archive, "oci-test", progress=messages.append, force=True)
    assert img.manifest["source"]["kind"] == "oci"
    assert img.digest != base_image.digest
    assert any("unpack OCI" in m for m in messages), messages
    try:
        with boot(img) as vm:
            _, t_init = vm.wait_for(r"AENV-INIT \d+\.\d+", timeout=90)
            print(f"OCI image: AENV-INIT after {t_init:.2f}s wall")
            if (default_envd_src() / "__main__.py").exists():
                m, _ = vm.wait_for(r"ENVD-READY 49983|AENV-ENVD-EXIT \d+", timeout=60)
                assert m.group(0) == "ENVD-READY 49983", vm.console()
    finally:
        drop_image(img.digest, "oci-test")


def test_nothing_left_behind() -> None:
    # runs last in this module: every boot above killed its QEMU and removed its files
    out = subprocess.run(["pgrep", "-af", "aenv-imgtest-"], capture_output=True, text=True)
    assert out.stdout.strip() == "", out.stdout
    leftovers = [
        *Path("/dev/shm").glob("aenv-imgtest-*"),
        *Path(tempfile.gettempdir()).glob("aenv-imgtest-*"),
    ]
    assert leftovers == []
    mounts = Path("/proc/self/mounts").read_text()
    assert str(cache_root()) not in mounts
    # a build by another suite may be in progress right now; a stale one would be old
    stale = [
        p
        for p in cache_root().iterdir()
        if p.name.startswith(".tmp-") and time.time() - p.stat().st_mtime > 300
    ]
    assert stale == []
