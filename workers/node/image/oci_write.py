"""Write OCI image layouts: pack directory trees or ready tar layers into an image.

No registry is reachable from our hosts, so tests (and operators importing a tree) make
images locally. Output is deterministic for a given input tree (gzip header time fixed,
owner names dropped), so packing the same tree twice gives the same manifest digest.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _put_blob(layout: Path, data: bytes) -> dict[str, Any]:
    digest = _sha256(data)
    path = layout / "blobs" / "sha256" / digest.split(":", 1)[1]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return {"digest": digest, "size": len(data)}


def _plain(layer: bytes) -> bytes:
    if layer.startswith(b"\x1f\x8b"):
        return gzip.decompress(layer)
    if layer.startswith(b"\x28\xb5\x2f\xfd"):
        # the zstd CLI rather than a Python binding: it is on every host we build on
        argv = ["zstd", "-q", "-d", "-c"]
        return subprocess.run(argv, input=layer, capture_output=True, check=True).stdout
    return layer


def _media_type(layer: bytes) -> str:
    if layer.startswith(b"\x1f\x8b"):
        return LAYER_GZIP
    if layer.startswith(b"\x28\xb5\x2f\xfd"):
        return LAYER_ZSTD
    return LAYER_TAR


def write_layout(
    out: Path,
    layers: Sequence[bytes],
    *,
    config: dict[str, Any] | None = None,
    ref: str = "latest",
    platform: bool = True,
) -> str:
    """Write an OCI image layout with `layers` (tar bytes, plain/gzip/zstd) at `out`.

    Returns the manifest digest. `config` is merged into the image config (e.g. Env).
    """
    out.mkdir(parents=True, exist_ok=True)
    (out / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}\n')
    descs = [{"mediaType": _media_type(layer), **_put_blob(out, layer)} for layer in layers]
    # a caller-supplied rootfs (tests of bad diff_ids, undecodable layers) is kept as is
    given = "rootfs" in (config or {})
    diff_ids = [] if given else [_sha256(_plain(layer)) for layer in layers]
    cfg: dict[str, Any] = {
        "architecture": "amd64",
        "os": "linux",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        **(config or {}),
    }
    cfg_desc = {"mediaType": CONFIG, **_put_blob(out, json.dumps(cfg, sort_keys=True).encode())}
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST, "config": cfg_desc, "layers": descs}
    man_desc: dict[str, Any] = {
        "mediaType": MANIFEST,
        **_put_blob(out, json.dumps(manifest, sort_keys=True).encode()),
        "annotations": {"org.opencontainers.image.ref.name": ref},
    }
    if platform:
        man_desc["platform"] = {"architecture": "amd64", "os": "linux"}
    index = {"schemaVersion": 2, "mediaType": INDEX, "manifests": [man_desc]}
    (out / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    return str(man_desc["digest"])


def _reset_owner_names(ti: tarfile.TarInfo) -> tarfile.TarInfo:
    ti.uname = ti.gname = ""  # numeric ids only: the guest's passwd decides names
    return ti


def tar_tree(src: Path, *, compress: bool = True, level: int = 1) -> bytes:
    """A layer tar of the tree at `src` (hard links, symlinks, devices kept), gzip if asked."""
    with tempfile.SpooledTemporaryFile(max_size=64 << 20) as raw:
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tf:
            for entry in sorted(os.listdir(src)):
                tf.add(src / entry, arcname=entry, filter=_reset_owner_names)
        raw.seek(0)
        data = raw.read()
    if not compress:
        return data
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=level, mtime=0) as gz:
        gz.write(data)
    return buf.getvalue()


def write_layout_from_dir(src: Path, out: Path, *, compress: bool = True) -> str:
    """Pack a directory tree as a one-layer OCI image layout; returns the manifest digest."""
    return write_layout(out, [tar_tree(src, compress=compress)])


def write_archive(layout: Path, archive: Path) -> None:
    """Tar an OCI layout directory into an OCI archive (the `oci-archive:` format)."""
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tf:
        for entry in sorted(os.listdir(layout)):
            tf.add(layout / entry, arcname=entry)
