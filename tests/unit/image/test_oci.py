"""OCI unpacking with synthetic layers: whiteouts, links, ownership, digests, traversal."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
from pathlib import Path
from typing import Any

import pytest

from workers.node.image.errors import ImageError
from workers.node.image.oci import open_layout, unpack
from workers.node.image.oci_write import write_archive, write_layout, write_layout_from_dir


def _ti(name: str, kind: bytes = tarfile.REGTYPE, **kw: Any) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.mode = 0o644 if kind != tarfile.DIRTYPE else 0o755
    for k, v in kw.items():
        setattr(ti, k, v)
    return ti


def layer(*entries: tuple[tarfile.TarInfo, bytes | None], gz: bool = True) -> bytes:
    """A layer tar from (TarInfo, data) pairs, gzip-compressed unless asked otherwise."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for ti, data in entries:
            if data is not None:
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
            else:
                tf.addfile(ti)
    raw = buf.getvalue()
    return gzip.compress(raw, mtime=0) if gz else raw


def f(name: str, data: bytes, **kw: Any) -> tuple[tarfile.TarInfo, bytes]:
    return _ti(name, **kw), data


def d(name: str, **kw: Any) -> tuple[tarfile.TarInfo, None]:
    return _ti(name, tarfile.DIRTYPE, **kw), None


def sym(name: str, target: str) -> tuple[tarfile.TarInfo, None]:
    return _ti(name, tarfile.SYMTYPE, linkname=target), None


def hard(name: str, target: str) -> tuple[tarfile.TarInfo, None]:
    return _ti(name, tarfile.LNKTYPE, linkname=target), None


def unpack_layers(tmp_path: Path, *layers: bytes) -> Path:
    layout = tmp_path / "layout"
    write_layout(layout, list(layers))
    root = tmp_path / "root"
    with open_layout(layout) as lo:
        unpack(lo, root, progress=lambda _m: None)
    return root


def test_layers_apply_in_order_with_whiteouts_and_opaque_dirs(tmp_path: Path) -> None:
    base = layer(
        d("etc"),
        f("etc/keep", b"k"),
        f("etc/gone", b"g"),
        d("var"),
        d("var/cache"),
        f("var/cache/a", b"a"),
        f("var/cache/b", b"b"),
        d("opt"),
        d("opt/tree"),
        f("opt/tree/x", b"x"),
    )
    top = layer(
        f("etc/.wh.gone", b""),
        f("var/cache/new", b"n"),  # listed before the opaque marker on purpose
        f("var/cache/.wh..wh..opq", b""),
        f("opt/.wh.tree", b""),
        f("etc/keep", b"k2"),
    )
    root = unpack_layers(tmp_path, base, top)
    assert (root / "etc/keep").read_bytes() == b"k2"
    assert not (root / "etc/gone").exists()
    assert sorted(os.listdir(root / "var/cache")) == ["new"]
    assert not (root / "opt/tree").exists()
    assert not any(p.name.startswith(".wh.") for p in root.rglob("*"))


def test_links_modes_ownership_and_xattrs(tmp_path: Path) -> None:
    suid = _ti("bin/tool", mode=0o4755, uid=0, gid=0)
    owned = _ti("home/u/file", uid=1234, gid=2345, mode=0o600)
    xattr = _ti("bin/cap")
    xattr.pax_headers = {"SCHILY.xattr.user.aenv": "yes"}
    root = unpack_layers(
        tmp_path,
        layer(
            d("bin"),
            d("home"),
            d("home/u", uid=1234, gid=2345),
            (suid, b"#!/bin/sh\n"),
            (owned, b"secret"),
            (xattr, b"c"),
            sym("bin/sh", "tool"),
            sym("abs", "/etc/passwd"),
            hard("bin/tool2", "bin/tool"),
        ),
    )
    assert stat.S_IMODE((root / "bin/tool").stat().st_mode) == 0o4755
    st = (root / "home/u/file").stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1234, 2345, 0o600)
    assert os.readlink(root / "bin/sh") == "tool"
    assert os.readlink(root / "abs") == "/etc/passwd"  # kept as is: resolved in the guest
    assert (root / "bin/tool2").stat().st_ino == (root / "bin/tool").stat().st_ino
    try:
        assert os.getxattr(root / "bin/cap", "user.aenv") == b"yes"
    except OSError:
        pytest.skip("filesystem without user xattrs")


def test_later_layer_replaces_dir_with_file_and_file_with_dir(tmp_path: Path) -> None:
    root = unpack_layers(
        tmp_path,
        layer(d("a"), f("a/inner", b"1"), f("b", b"2")),
        layer(f("a", b"now a file"), d("b"), f("b/c", b"3")),
    )
    assert (root / "a").read_bytes() == b"now a file"
    assert (root / "b/c").read_bytes() == b"3"


def test_symlinked_parent_cannot_escape_the_root(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    root = unpack_layers(
        tmp_path,
        layer(sym("etc", str(outside)), sym("up", "../../../..")),
        layer(f("etc/evil", b"x"), f("up/evil2", b"y")),
    )
    assert list(outside.iterdir()) == []
    # both resolve inside the tree, as they would inside the guest
    assert (root / str(outside).lstrip("/") / "evil").read_bytes() == b"x"
    assert (root / "evil2").read_bytes() == b"y"


@pytest.mark.parametrize(
    "bad",
    [
        [f("../escape", b"x")],
        [f("a/../../escape", b"x")],
        [f("ok", b"x"), hard("h", "../../etc/passwd")],
    ],
)
def test_path_traversal_is_rejected(
    tmp_path: Path, bad: list[tuple[tarfile.TarInfo, bytes | None]]
) -> None:
    with pytest.raises(ImageError, match="traversal"):
        unpack_layers(tmp_path, layer(*bad))
    assert not (tmp_path / "escape").exists()


def test_hardlink_to_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match="hard link"):
        unpack_layers(tmp_path, layer(hard("h", "nope")))


def test_corrupt_blob_names_the_layer(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    write_layout(layout, [layer(f("a", b"1")), layer(f("b", b"2"))])
    manifest = json.loads((layout / "index.json").read_text())["manifests"][0]["digest"]
    layers = json.loads((layout / "blobs/sha256" / manifest.split(":")[1]).read_text())["layers"]
    victim = layout / "blobs/sha256" / layers[1]["digest"].split(":")[1]
    data = bytearray(victim.read_bytes())
    data[-5] ^= 0xFF
    victim.write_bytes(bytes(data))
    with open_layout(layout) as lo, pytest.raises(ImageError) as err:
        unpack(lo, tmp_path / "root", progress=lambda _m: None)
    assert layers[1]["digest"] in str(err.value)
    assert "digest mismatch" in str(err.value)


def test_diff_id_mismatch_is_detected(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    write_layout(
        layout,
        [layer(f("a", b"1"))],
        config={"rootfs": {"type": "layers", "diff_ids": ["sha256:" + "0" * 64]}},
    )
    with open_layout(layout) as lo, pytest.raises(ImageError, match="diff_id"):
        unpack(lo, tmp_path / "root", progress=lambda _m: None)


def test_garbage_layer_is_a_clear_error(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    garbage = b"\x1f\x8b" + b"not really gzip" * 10
    write_layout(layout, [garbage], config={"rootfs": {"type": "layers", "diff_ids": []}})
    with open_layout(layout) as lo, pytest.raises(ImageError, match=r"sha256:.*corrupt gzip"):
        unpack(lo, tmp_path / "root", progress=lambda _m: None)


def test_layer_that_is_not_a_tar_is_a_clear_error(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    write_layout(layout, [gzip.compress(b"\x01" * 1024)])
    with (
        open_layout(layout) as lo,
        pytest.raises(ImageError, match=r"layer 0 sha256:.*corrupt tar"),
    ):
        unpack(lo, tmp_path / "root", progress=lambda _m: None)


def test_uncompressed_and_zstd_layers(tmp_path: Path) -> None:
    plain = layer(f("p", b"plain"), gz=False)
    layers = [plain]
    zstd = shutil.which("zstd")
    if zstd:
        import subprocess

        layers.append(
            subprocess.run(
                [zstd, "-q", "-c"],
                input=layer(f("z", b"zst"), gz=False),
                capture_output=True,
                check=True,
            ).stdout
        )
    root = unpack_layers(tmp_path, *layers)
    assert (root / "p").read_bytes() == b"plain"
    if zstd:
        assert (root / "z").read_bytes() == b"zst"


def test_archive_and_platform_choice(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    write_layout(layout, [layer(f("amd", b"1"))])
    index = json.loads((layout / "index.json").read_text())
    amd = index["manifests"][0]
    arm = {
        **amd,
        "digest": "sha256:" + "1" * 64,
        "platform": {"os": "linux", "architecture": "arm64"},
    }
    index["manifests"] = [arm, amd]  # the arm64 blob does not even exist: must not be read
    (layout / "index.json").write_text(json.dumps(index))
    archive = tmp_path / "image.tar"
    write_archive(layout, archive)
    with open_layout(archive) as lo:
        assert lo.manifest_digest == amd["digest"]
        unpack(lo, tmp_path / "root", progress=lambda _m: None)
    assert (tmp_path / "root/amd").read_bytes() == b"1"


def test_not_a_layout(tmp_path: Path) -> None:
    (tmp_path / "junk").write_bytes(b"nothing")
    with pytest.raises(ImageError, match="neither"), open_layout(tmp_path / "junk"):
        pass
    with pytest.raises(ImageError, match=r"no index\.json"), open_layout(tmp_path):
        pass


def test_writer_round_trips_a_tree_deterministically(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "usr/bin").mkdir(parents=True)
    (src / "usr/bin/x").write_text("x")
    os.link(src / "usr/bin/x", src / "usr/bin/y")
    (src / "bin").symlink_to("usr/bin")
    d1 = write_layout_from_dir(src, tmp_path / "l1")
    d2 = write_layout_from_dir(src, tmp_path / "l2")
    assert d1 == d2
    with open_layout(tmp_path / "l1") as lo:
        unpack(lo, tmp_path / "root", progress=lambda _m: None)
    root = tmp_path / "root"
    assert (root / "bin/x").read_text() == "x"
    assert (root / "usr/bin/y").stat().st_ino == (root / "usr/bin/x").stat().st_ino


def test_ref_picks_one_of_several_tagged_images(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    write_layout(a, [layer(f("which", b"one"))], ref="one")
    write_layout(b, [layer(f("which", b"two"))], ref="two")
    # merge b into a: one layout, two tagged images
    for blob in (b / "blobs/sha256").iterdir():
        shutil.copy(blob, a / "blobs/sha256" / blob.name)
    index = json.loads((a / "index.json").read_text())
    index["manifests"] += json.loads((b / "index.json").read_text())["manifests"]
    (a / "index.json").write_text(json.dumps(index))
    with pytest.raises(ImageError, match="choose one by its ref"), open_layout(a):
        pass
    with pytest.raises(ImageError, match="tagged 'three'"), open_layout(a, "three"):
        pass
    with open_layout(a, "two") as lo:
        unpack(lo, tmp_path / "root", progress=lambda _m: None)
    assert (tmp_path / "root/which").read_bytes() == b"two"


def test_layers_two_images_share_are_unpacked_once(tmp_path: Path) -> None:
    """The unpacked-layer cache: a second image starting with the first's layer starts
    from the cached tree, and what its own layer changes (overwrite, whiteout) never
    reaches the cached tree or the first image (hard links are never written through)."""
    from workers.node.image.oci_chains import chain_ids

    base = layer(d("etc"), f("etc/os", b"shared"), f("etc/gone", b"g"))
    mine = layer(f("etc/os", b"changed"), f("etc/.wh.gone", b""))
    cache = tmp_path / "cache"
    trees = []
    for name, layers in (("one", [base]), ("two", [base, mine])):
        layout = tmp_path / f"layout-{name}"
        write_layout(layout, layers)
        messages: list[str] = []
        with open_layout(layout) as lo:
            unpack(lo, tmp_path / name, progress=messages.append, cache=cache)
        trees.append((tmp_path / name, messages))
    (one, first), (two, second) = trees
    assert not any("already unpacked" in m for m in first)
    assert any("layers 0-0 already unpacked" in m for m in second), second
    assert sum(m.startswith("oci: layer ") for m in second) == 1  # only its own was applied
    assert (two / "etc/os").read_bytes() == b"changed" and not (two / "etc/gone").exists()
    assert (one / "etc/os").read_bytes() == b"shared" and (one / "etc/gone").exists()
    [chain] = chain_ids([f"sha256:{hashlib.sha256(gzip.decompress(base)).hexdigest()}"])
    kept = cache / chain.replace(":", "-") / "tree"
    assert (kept / "etc/os").read_bytes() == b"shared" and (kept / "etc/gone").exists()
