"""Unpack an OCI image (layout directory or archive) into a root tree, in pure Python.

index.json → manifest (linux/amd64 if there is a choice) → config → layers in order.
Every blob is checked against its digest before it is used, and every uncompressed layer
against the config's diff_id. Layers are applied the way container runtimes do
(whiteouts first, then entries: `oci_apply`) and the tree after each is kept by chain id
(`oci_chains`). The image is untrusted: names with `..` are rejected and all paths
resolve inside the target tree (see fsutil), so a layer can never write outside it.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from .errors import ImageError
from .fsutil import guest_path
from .layerdisk import ChainDisks
from .leftovers import Made
from .oci_apply import apply_layer
from .oci_chains import chain_dir, chain_ids, keep_chain, link_tree

INDEX_TYPES = {
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
}
MANIFEST_TYPES = {
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
}
_DIGEST = re.compile(r"^(sha256|sha512):([0-9a-f]{64}|[0-9a-f]{128})$")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Descriptor:
    """An OCI content descriptor: what a blob is and how to verify it."""

    media_type: str
    digest: str
    size: int

    @classmethod
    def parse(cls, d: Any, what: str) -> Descriptor:
        """Validate a descriptor from JSON; the digest must be safe to use in a path."""
        if not isinstance(d, dict) or not isinstance(d.get("digest"), str):
            raise ImageError(f"{what}: malformed descriptor {d!r}")
        if not _DIGEST.match(d["digest"]):
            raise ImageError(f"{what}: unsupported or malformed digest {d['digest']!r}")
        return cls(str(d.get("mediaType", "")), d["digest"], int(d.get("size", -1)))


class BlobStore(Protocol):
    """Where the layout's files live: a directory or a tar archive."""

    def open(self, relpath: str) -> IO[bytes]: ...


class _DirStore:
    """A layout directory; its blobs in it, or in a blob directory shared by many layouts
    (`skopeo copy --dest-shared-blob-dir`: the node's layer cache, `registry.py`)."""

    def __init__(self, root: Path, blobs: Path | None = None) -> None:
        self.root = root
        self.blobs = blobs

    def open(self, relpath: str) -> IO[bytes]:
        path = self.root / relpath
        if self.blobs is not None and relpath.startswith("blobs/"):
            path = self.blobs / relpath.removeprefix("blobs/")
        try:
            return path.open("rb")
        except OSError as e:
            raise ImageError(f"OCI layout {self.root}: cannot read {relpath}: {e}") from e


class _TarStore:
    def __init__(self, tf: tarfile.TarFile, name: str) -> None:
        self.tf = tf
        self.name = name
        self.members = {}
        for m in tf.getmembers():
            key = "/".join(p for p in m.name.split("/") if p not in ("", "."))
            self.members[key] = m

    def open(self, relpath: str) -> IO[bytes]:
        m = self.members.get(relpath)
        f = self.tf.extractfile(m) if m is not None and m.isfile() else None
        if f is None:
            raise ImageError(f"OCI archive {self.name}: no file {relpath}")
        return f


def _blob_path(digest: str) -> str:
    algo, _, hexd = digest.partition(":")
    return f"blobs/{algo}/{hexd}"


def _hash_stream(f: IO[bytes], algo: str) -> tuple[str, int]:
    h = hashlib.new(algo)
    n = 0
    while chunk := f.read(_CHUNK):
        h.update(chunk)
        n += len(chunk)
    return f"{algo}:{h.hexdigest()}", n


@dataclass
class Layout:
    """An opened OCI image: the chosen manifest, its config and layer descriptors."""

    store: BlobStore
    source: str
    manifest_digest: str
    manifest: dict[str, Any]
    config: dict[str, Any]
    layers: list[Descriptor]

    def open_blob(self, desc: Descriptor) -> IO[bytes]:
        """Open a blob's raw bytes (not yet verified)."""
        return self.store.open(_blob_path(desc.digest))

    def verify_blob(self, desc: Descriptor, what: str) -> None:
        """Fail unless the blob's bytes hash to its digest (and match its size)."""
        algo = desc.digest.split(":", 1)[0]
        with self.open_blob(desc) as f:
            got, size = _hash_stream(f, algo)
        if got != desc.digest:
            raise ImageError(f"{what} {desc.digest}: blob digest mismatch (content is {got})")
        if desc.size >= 0 and size != desc.size:
            raise ImageError(f"{what} {desc.digest}: size {size} != descriptor size {desc.size}")

    def read_json(self, desc: Descriptor, what: str) -> dict[str, Any]:
        """A verified JSON blob (manifest, index, config)."""
        self.verify_blob(desc, what)
        with self.open_blob(desc) as f:
            try:
                data = json.load(f)
            except ValueError as e:
                raise ImageError(f"{what} {desc.digest} is not JSON: {e}") from e
        if not isinstance(data, dict):
            raise ImageError(f"{what} {desc.digest} is not a JSON object")
        return data


def _platform_ok(desc: dict[str, Any]) -> bool | None:
    p = desc.get("platform")
    if not isinstance(p, dict):
        return None  # unknown: acceptable if nothing better
    return p.get("os") == "linux" and p.get("architecture") == "amd64"


REF_ANNOTATION = "org.opencontainers.image.ref.name"


def _choose_manifest(
    store: BlobStore, source: str, ref: str | None
) -> tuple[Descriptor, dict[str, Any]]:
    with store.open("index.json") as f:
        try:
            index = json.load(f)
        except ValueError as e:
            raise ImageError(f"{source}: index.json is not JSON: {e}") from e
    probe = Layout(store, source, "", {}, {}, [])
    candidates: list[tuple[bool | None, Descriptor]] = []

    def walk(idx: dict[str, Any], depth: int) -> None:
        if depth > 4:
            raise ImageError(f"{source}: image indexes nest too deep")
        for raw in idx.get("manifests") or []:
            desc = Descriptor.parse(raw, f"{source} index")
            tag = (raw.get("annotations") or {}).get(REF_ANNOTATION)
            if depth == 0 and ref is not None and tag != ref:
                continue  # the tag names the top-level entry; nested ones inherit it
            ok = _platform_ok(raw)
            if ok is False:
                continue
            if desc.media_type in INDEX_TYPES:
                walk(probe.read_json(desc, "image index"), depth + 1)
            elif desc.media_type in MANIFEST_TYPES or not desc.media_type:
                candidates.append((ok, desc))

    walk(index, 0)
    exact = [d for ok, d in candidates if ok]
    pool = exact or [d for _, d in candidates]
    tagged = f" tagged {ref!r}" if ref is not None else ""
    if not pool:
        raise ImageError(f"{source}: no linux/amd64 image manifest{tagged} in index.json")
    if len({d.digest for d in pool}) > 1:
        raise ImageError(
            f"{source}: index.json lists {len(pool)} candidate images; choose one by its ref"
        )
    return pool[0], probe.read_json(pool[0], "manifest")


@contextmanager
def open_layout(
    path: Path, ref: str | None = None, *, blobs: Path | None = None
) -> Iterator[Layout]:
    """Open an OCI layout directory or OCI archive and resolve its linux/amd64 image.

    `ref` picks the index entry annotated `org.opencontainers.image.ref.name` = ref (the
    tag, as in `skopeo copy … oci:dir:tag`); without it the index must hold one image.
    `blobs`: the layout's blobs live in this shared directory (`<algo>/<hex>`) instead.
    """
    path = Path(path)
    if path.is_dir():
        if not (path / "index.json").is_file():
            raise ImageError(f"{path} is not an OCI image layout (no index.json)")
        yield _resolve(_DirStore(path, blobs), str(path), ref)
        return
    try:
        tf = tarfile.open(path, "r:*")  # noqa: SIM115  (closed by the `with tf` below)
    except (OSError, tarfile.TarError) as e:
        raise ImageError(f"{path} is neither an OCI layout directory nor a tar archive: {e}") from e
    with tf:
        store = _TarStore(tf, str(path))
        if "index.json" not in store.members:
            raise ImageError(f"{path} is not an OCI archive (no index.json)")
        yield _resolve(store, str(path), ref)


def _resolve(store: BlobStore, source: str, ref: str | None) -> Layout:
    desc, manifest = _choose_manifest(store, source, ref)
    if manifest.get("mediaType") in INDEX_TYPES:
        raise ImageError(f"{source}: manifest {desc.digest} is an index")
    cfg_desc = Descriptor.parse(manifest.get("config"), f"manifest {desc.digest} config")
    probe = Layout(store, source, desc.digest, manifest, {}, [])
    config = probe.read_json(cfg_desc, "image config")
    arch, os_ = config.get("architecture", "amd64"), config.get("os", "linux")
    if (arch, os_) != ("amd64", "linux"):
        raise ImageError(f"{source}: image is {os_}/{arch}, need linux/amd64")
    layers = [
        Descriptor.parse(d, f"manifest {desc.digest} layer {i}")
        for i, d in enumerate(manifest.get("layers") or [])
    ]
    return Layout(store, source, desc.digest, manifest, config, layers)


def _decompressor(head: bytes, desc: Descriptor) -> str:
    mt = desc.media_type
    if "encrypted" in mt or (mt and "tar" not in mt and "rootfs" not in mt):
        raise ImageError(f"layer {desc.digest}: unsupported media type {mt!r}")
    if head.startswith(b"\x1f\x8b"):
        return "gzip"
    if head.startswith(b"\x28\xb5\x2f\xfd"):
        return "zstd"
    return "none"


def _decompress_zstd(src: IO[bytes], dst: IO[bytes], desc: Descriptor) -> None:
    try:
        import zstandard  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        zstd = shutil.which("zstd")
        if zstd is None:
            raise ImageError(
                f"layer {desc.digest} is zstd-compressed; install python zstandard or zstd"
            ) from None
        with tempfile.TemporaryFile() as raw:
            shutil.copyfileobj(src, raw, _CHUNK)
            raw.seek(0)
            proc = subprocess.run([zstd, "-q", "-d", "-c"], stdin=raw, stdout=dst, check=False)
        if proc.returncode != 0:
            raise ImageError(f"layer {desc.digest}: zstd decompression failed") from None
        return
    zstandard.ZstdDecompressor().copy_stream(src, dst)


def _uncompressed_layer(layout: Layout, desc: Descriptor, out: IO[bytes]) -> str:
    """Write the layer's plain tar to `out`; return its digest (the diff_id)."""
    with layout.open_blob(desc) as f:
        head = f.read(4)
    kind = _decompressor(head, desc)
    with layout.open_blob(desc) as raw:
        try:
            if kind == "gzip":
                with gzip.GzipFile(fileobj=raw) as gz:
                    shutil.copyfileobj(gz, out, _CHUNK)
            elif kind == "zstd":
                _decompress_zstd(raw, out, desc)
            else:
                shutil.copyfileobj(raw, out, _CHUNK)
        except (OSError, EOFError) as e:
            raise ImageError(f"layer {desc.digest}: corrupt {kind} stream: {e}") from e
    out.flush()
    out.seek(0)
    digest, _ = _hash_stream(out, "sha256")
    out.seek(0)
    return digest


def unpack(
    layout: Layout,
    dest: Path,
    progress: Callable[[str], None] = print,
    *,
    cache: Path | None = None,
    made: Made | None = None,
    disks: ChainDisks | None = None,
) -> str | None:
    """Unpack all layers of `layout`, in order, into a new directory `dest`.

    With `cache` (the node's unpacked-layer cache), the tree after each layer is kept under
    its chain id as hard links, and an image whose first layers are a chain already there
    starts from it: layers two images share are unpacked once. Hard links are safe because
    unpacking never writes into an existing file (it unlinks and creates), and directories
    are copied, not linked. `made` (the import's ledger, `leftovers.py`) hears each chain
    this call kept, so a failure later removes them. With `disks`, each kept chain also
    gets its ext4 (`layerdisk`). Returns the top chain's id, if the image has chains."""
    diff_ids = (layout.config.get("rootfs") or {}).get("diff_ids") or []
    if diff_ids and len(diff_ids) != len(layout.layers):
        n, m = len(diff_ids), len(layout.layers)
        raise ImageError(f"{layout.source}: config lists {n} diff_ids for {m} layers")
    chains = chain_ids(diff_ids) if cache is not None and diff_ids else []
    if made is not None:
        made.use(blobs=[d.digest for d in layout.layers], chains=chains)
    start = 0
    for i in reversed(range(len(chains))):
        kept = chain_dir(cache, chains[i])
        if (kept / "ok").is_file():
            link_tree(kept / "tree", dest)
            start = i + 1
            progress(f"oci: layers 0-{i} already unpacked (chain {chains[i][7:19]})")
            if disks is not None:
                disks.build(chains, i)
            break
    else:
        dest.mkdir(mode=0o755)
    for i in range(start, len(layout.layers)):
        desc = layout.layers[i]
        label = f"layer {i} {desc.digest}"
        progress(f"oci: {label} ({desc.size >> 10} KiB)")
        layout.verify_blob(desc, f"layer {i}")
        with tempfile.TemporaryFile(dir=dest.parent) as plain:
            diff_id = _uncompressed_layer(layout, desc, plain)
            if diff_ids and diff_ids[i] != diff_id:
                raise ImageError(f"{label}: uncompressed digest {diff_id} != diff_id {diff_ids[i]}")
            apply_layer(plain, root=dest, label=label)
        if chains and keep_chain(cache, chains[i], dest) and made is not None:
            made.wrote(chains=[chains[i]])
        if chains and disks is not None:
            disks.build(chains, i)
    return chains[-1] if chains else None


def image_defaults(config: dict[str, Any], tree: Path) -> dict[str, Any]:
    """An image config's ENV, USER and WORKDIR, as a template's defaults for its sandboxes
    (ENTRYPOINT and CMD are not run: a template starts only what it says, E2B's start
    command). USER as a name the image's /etc/passwd knows (`uid[:gid]` looked up there);
    a user it does not know is left out, so E2B's default `user` applies."""
    cfg = config.get("config") or {}
    env = {}
    for item in cfg.get("Env") or []:
        key, sep, value = str(item).partition("=")
        if sep and key:
            env[key] = value
    user = str(cfg.get("User") or "").split(":", 1)[0] or None
    if user is not None:
        user = _passwd_name(tree, user)
    workdir = str(cfg.get("WorkingDir") or "") or None
    return {"env": env, "user": user, "workdir": workdir}


def _passwd_name(tree: Path, user: str) -> str | None:
    try:  # resolved inside the tree: the image is untrusted (its passwd may be a symlink)
        lines = guest_path(tree, "etc/passwd", follow_last=True).read_text().splitlines()
    except (OSError, ImageError):
        return None
    for line in lines:
        fields = line.split(":")
        if len(fields) >= 3 and (fields[0] == user or fields[2] == user):
            return fields[0]
    return None
