"""Build guest images (kernel + initramfs + ext4 root) into the cache, or find them there.

`build_base` makes the default Debian image; `build_from_oci` makes one from an OCI image
layout or archive. Both are idempotent: the image digest is computed from the inputs
first, and an image already in the cache is returned without building anything.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.diskdigest import chunk_list

from . import cache as _cache
from .cmdline import CMDLINE_BASE, GUEST_GW, GUEST_IP, GUEST_MAC
from .content import disk_stamp
from .disk import DEFAULT_FREE, census, disk_uuid, root_size
from .errors import ImageError
from .initramfs import build_initramfs, read_static_busybox, sha256_hex
from .inject import inject
from .kernel import (
    OPTIONAL_MODULES,
    REQUIRED_MODULES,
    Kernel,
    KernelPackage,
    ensure_kernel,
    resolve_package_cached,
)
from .layerdisk import ChainDisks, root_disk
from .leftovers import Made, disk_full_error
from .oci_chains import link_tree
from .rootfs import LOGIN_PROFILE_VERSION, DebootstrapSpec, debootstrap, tune_login_profile
from .scripts import ENVD_PORT, initramfs_init

# Bumped when what the builder writes changes in a way the inputs below do not capture.
# 2: envd, PID 1 and their busybox moved to the runtime disk (`runtime.py`).
# 3: the root disk is sized by what the tree needs plus free space (`free`, not `size`),
#    with a recipe-derived UUID, a fixed mkfs clock and no zeroed journal (`disk.py`).
FORMAT_VERSION = 3

Progress = Callable[[str], None]


@dataclass(frozen=True)
class GuestImage:
    """A complete image in the cache: what the VMM driver needs to boot it."""

    digest: str
    kernel: Path  # PVH vmlinux, for QEMU -kernel
    initrd: Path  # uncompressed newc cpio, for -initrd
    rootfs: Path  # raw ext4, read-only base for per-VM qcow2 overlays
    kernel_cmdline_base: str  # add host/VM knobs with `kernel_cmdline(image, ...)`
    manifest: dict[str, Any]

    @property
    def content_digest(self) -> str | None:
        """The root disk's content digest (`shared/diskdigest.py`), recorded when it was
        built; None for an image built before the digest was recorded."""
        content = self.manifest.get("content") or {}
        return content.get("digest")

    @classmethod
    def load(cls, directory: Path) -> GuestImage:
        """Read a published image directory; error if it is not a complete image."""
        try:
            manifest = json.loads((directory / "manifest.json").read_text())
        except (OSError, ValueError) as e:
            raise ImageError(f"{directory} is not a complete image: {e}") from e
        image = cls(
            digest=manifest["digest"],
            kernel=directory / "vmlinux",
            initrd=directory / "initrd.cpio",
            rootfs=_cache.root_disk(directory),  # or a lazy base's stub
            kernel_cmdline_base=manifest["kernel_cmdline_base"],
            manifest=manifest,
        )
        for p in (image.kernel, image.initrd, image.rootfs):
            if not p.is_file():
                raise ImageError(f"image {directory} lacks {p.name}")
        return image


def default_envd_src() -> Path:
    """The repository's `envd/` package (what gets copied into every guest)."""
    spec = importlib.util.find_spec("envd")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(__file__).resolve().parents[3] / "envd"


def scripts_hash() -> str:
    """Digest input for the initramfs script (module lines come from the kernel version);
    PID 1's script is the runtime disk's."""
    return hashlib.sha256(initramfs_init([]).encode()).hexdigest()


@contextmanager
def step(progress: Progress, what: str) -> Iterator[None]:
    """Report a build step and how long it took."""
    t0 = time.monotonic()
    progress(f"{what} ...")
    yield
    progress(f"{what}: done in {time.monotonic() - t0:.1f}s")


@dataclass(frozen=True)
class _Common:
    """Inputs shared by every image kind. The kernel itself is unpacked only when an image
    is built: the recipe needs its package's name and version, and a node that fetches
    the fleet's build (`supply.py`) never needs the kernel's files."""

    package: KernelPackage
    busybox: bytes
    #: free bytes the root disk keeps beyond the image (its size follows from the tree)
    free: int
    root: Path = dataclasses.field(compare=False)
    progress: Progress = dataclasses.field(compare=False)

    @functools.cached_property
    def kernel(self) -> Kernel:
        with _cache.locked(self.root, "kernel"), step(self.progress, f"kernel {self.package.name}"):
            return ensure_kernel(self.root, self.package, self.progress)

    def digest_inputs(self, source: dict[str, object]) -> dict[str, object]:
        return {
            "format": FORMAT_VERSION,
            "source": source,
            "kernel": {"package": self.package.name, "version": self.package.version},
            "modules": [list(REQUIRED_MODULES), list(OPTIONAL_MODULES)],
            "scripts": scripts_hash(),
            "busybox": sha256_hex(self.busybox),
            "free": self.free,
            "cmdline": CMDLINE_BASE,
        }

    def recipe(self, source: dict[str, object]) -> str:
        """The recipe digest of an image from `source`: known before anything is built."""
        return _cache.digest_of(self.digest_inputs(source))


def _common(root: Path, free: int, progress: Progress) -> _Common:
    package = resolve_package_cached(root / "kernel-resolved.json", progress)
    return _Common(package, read_static_busybox(), free, root, progress)


def _cached(root: Path, digest: str) -> GuestImage | None:
    """What recipe `digest` built, if this cache has it (as that recipe's image: the entry
    it shares with another recipe of the same bytes names the first)."""
    d = _cache.entry_dir(root, digest)
    if d is None:
        return None
    return dataclasses.replace(GuestImage.load(d), digest=digest)


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _assemble(
    root: Path,
    digest: str,
    common: _Common,
    source: dict[str, object],
    populate: Callable[[Path], dict[str, Any] | None],
    progress: Progress,
    base: Callable[[], tuple[Path, Path] | None] = lambda: None,
) -> GuestImage:
    """Build image `digest` in a staging dir and publish it (caller holds its lock).
    `populate` fills the tree and may say what the image asks of its sandboxes (`defaults`:
    an OCI image's ENV, USER, WORKDIR). `base`: after it, the (disk, tree) of the image's
    top layer chain, the root disk is derived from (`layerdisk.root_disk`)."""
    t0 = time.monotonic()
    with (
        _cache.staging(root, digest) as tmp,
        disk_full_error(f"build of image {digest[:12]} in {root}"),
    ):
        tree = tmp / "tree"
        defaults = populate(tree) or {}
        with step(progress, "add user, /etc files, the runtime's mount point"):
            info = inject(tree, image_info={"digest": digest, "source": source})
        counted = census(tree)
        size = root_size(counted.need, common.free)
        with step(progress, f"mkfs.ext4 ({size >> 20} MiB: {common.free >> 20} MiB free)"):
            made_by = root_disk(
                tree,
                tmp / "root.ext4",
                size,
                fs_uuid=disk_uuid(digest),
                counted=counted,
                base=base(),
                progress=progress,
            )
        shutil.rmtree(tree)
        with step(progress, "content digest of the root disk"):
            content = chunk_list(tmp / "root.ext4")
        with step(progress, "initramfs"):
            initrd = build_initramfs(common.kernel, common.busybox)
            (tmp / "initrd.cpio").write_bytes(initrd)
        _link_or_copy(common.kernel.vmlinux, tmp / "vmlinux")
        manifest = {
            "digest": digest,
            "format": FORMAT_VERSION,
            "source": source,
            "inputs": common.digest_inputs(source),
            "kernel": {
                "package": common.kernel.package.name,
                "version": common.kernel.package.version,
                "release": common.kernel.package.release,
                "modules": [m.name for m in common.kernel.modules],
            },
            "initrd_sha256": sha256_hex(initrd),
            # what the disk is (its bytes, `shared/diskdigest.py`); `digest` is the recipe
            "content": {
                "digest": content.digest,
                **content.as_json(),
                "stamp": disk_stamp(tmp / "root.ext4"),  # kept by the publishing rename
            },
            "rootfs": {
                "fs": "ext4",
                "size": size,
                "label": "root",
                "need": counted.need,
                "free": common.free,
                "made": made_by,
            },
            "guest": {
                "python": info.python,
                "user": "user",
                "user_uid": info.user_uid,
                "ip": GUEST_IP,
                "gateway": GUEST_GW,
                "mac": GUEST_MAC,
                "envd_port": ENVD_PORT,
                "init": "/opt/aenv/init",  # on envd's runtime disk (runtime.py)
                # the template's defaults for envd (`guest_defaults`): the image's config
                "defaults": defaults,
            },
            "kernel_cmdline_base": CMDLINE_BASE,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "build_seconds": round(time.monotonic() - t0, 1),
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        final = _cache.publish_content(root, tmp, digest, content.digest)
    progress(f"image {digest} ready in {final}")
    return dataclasses.replace(GuestImage.load(final), digest=digest)


def base_rootfs_tree(
    cache: Path | None = None, spec: DebootstrapSpec | None = None, progress: Progress = print
) -> Path:
    """The cached debootstrap tree (made on first use). Treat it as read-only."""
    root = _cache.cache_root(cache)
    spec = spec or DebootstrapSpec()
    key = f"rootfs-{_cache.digest_of(spec.key())[:32]}"
    final = root / key
    if final.is_dir():
        return final
    with _cache.locked(root, key):
        if final.is_dir():
            return final
        with _cache.staging(root, key) as tmp, step(progress, "debootstrap (about a minute)"):
            debootstrap(spec, tmp / "tree", tmp / "debootstrap.log", progress)
            os.rename(tmp / "tree", final)
    return final


def _base_source(spec: DebootstrapSpec) -> dict[str, object]:
    return {**spec.key(), "login_profile": LOGIN_PROFILE_VERSION}


def base_recipe(
    cache: Path | None = None,
    *,
    progress: Progress = print,
    free_bytes: int = DEFAULT_FREE,
    spec: DebootstrapSpec | None = None,
) -> str:
    """The recipe digest `build_base` with these arguments builds (or finds): computed
    from its inputs alone, so the fleet can be asked for it before anything is built."""
    root = _cache.cache_root(cache)
    return _common(root, free_bytes, progress).recipe(_base_source(spec or DebootstrapSpec()))


def build_base(
    cache: Path | None = None,
    *,
    progress: Progress = print,
    force: bool = False,
    free_bytes: int = DEFAULT_FREE,
    spec: DebootstrapSpec | None = None,
) -> GuestImage:
    """The default Debian guest image: from the cache, or built (debootstrap cached apart).
    `free_bytes`: what its root disk keeps free for sandboxes.

    With default arguments the result is also recorded as the image named `base`.
    """
    root = _cache.cache_root(cache)
    spec = spec or DebootstrapSpec()
    common = _common(root, free_bytes, progress)
    source = _base_source(spec)
    digest = common.recipe(source)
    if not force and (img := _cached(root, digest)) is not None:
        progress(f"image {digest} is cached")
        return img
    tree = base_rootfs_tree(root, spec, progress)
    with _cache.locked(root, digest):
        if not force and (img := _cached(root, digest)) is not None:
            return img

        def populate(dst: Path) -> None:
            with step(progress, "link the cached debootstrap tree"):
                link_tree(tree, dst)  # safe: injection never writes into an existing file
                tune_login_profile(dst)
            return None

        img = _assemble(root, digest, common, source, populate, progress)
    if (spec, free_bytes) == (DebootstrapSpec(), DEFAULT_FREE):
        _cache.link_name(root, "base", digest)  # only the default image is `base`
    return img


def _oci_source(manifest: str) -> dict[str, object]:
    return {"kind": "oci", "manifest": manifest}


def oci_recipe(
    manifest: str,
    cache: Path | None = None,
    *,
    progress: Progress = print,
    free_bytes: int = DEFAULT_FREE,
) -> str:
    """The recipe digest `build_from_oci` gives the image whose manifest digest is
    `manifest`: a registry's answer to `skopeo inspect` is enough (`registry.resolve`),
    so the fleet is asked for the import before any layer is pulled (images-at-scale S5)."""
    root = _cache.cache_root(cache)
    return _common(root, free_bytes, progress).recipe(_oci_source(manifest))


def build_from_oci(
    path: Path,
    name: str,
    cache: Path | None = None,
    *,
    progress: Progress = print,
    force: bool = False,
    free_bytes: int = DEFAULT_FREE,
    ref: str | None = None,
    blobs: Path | None = None,
    manifest: str | None = None,
    made: Made | None = None,
) -> GuestImage:
    """A guest image from an OCI image layout directory or OCI archive (tar of a layout).

    `ref` selects a tagged image when the layout holds several; `blobs` is a blob
    directory the layout shares with others (a registry pull's layer cache). The image is
    recorded under `name` (`names/<name>`); its digest depends on the content, not the name.
    Its root disk is the image plus `free_bytes` free, whatever the image's size.
    `manifest` names the image by the registry's manifest digest (a pull's
    `Pulled.manifest`) instead of the layout's: skopeo rewrites a Docker manifest as an
    OCI one on the way, and the recipe must be the one `oci_recipe` computed before.
    `made`: the import's ledger (`leftovers.forget_on_failure`), told the chains kept.
    """
    from .oci import image_defaults, open_layout, unpack

    if not name or "/" in name or name.startswith("."):
        raise ImageError(f"bad image name {name!r}")
    root = _cache.cache_root(cache)
    with open_layout(path, ref, blobs=blobs) as layout:
        source = _oci_source(manifest or layout.manifest_digest)
        common = _common(root, free_bytes, progress)
        digest = common.recipe(source)
        img = None if force else _cached(root, digest)
        if img is None:
            with _cache.locked(root, digest):
                img = None if force else _cached(root, digest)
                if img is None:
                    top: list[tuple[Path, Path] | None] = [None]

                    def populate(dst: Path) -> dict[str, Any]:
                        disks = ChainDisks(root / "layers", common.free, dst.parent, progress)
                        with step(progress, f"unpack OCI {layout.manifest_digest}"):
                            chain = unpack(
                                layout, dst, progress, cache=root / "layers", made=made, disks=disks
                            )
                        top[0] = disks.top(chain) if chain else None
                        return image_defaults(layout.config, dst)

                    img = _assemble(
                        root, digest, common, source, populate, progress, base=lambda: top[0]
                    )
        else:
            progress(f"image {digest} is cached")
    _cache.link_name(root, name, digest)
    return img


def name_image(recipe: str, name: str, cache: Path | None = None) -> GuestImage:
    """The cached image of `recipe` (built here or fetched), recorded under `name` as
    `build_from_oci` records what it builds."""
    root = _cache.cache_root(cache)
    img = _cached(root, recipe)
    if img is None:
        raise ImageError(f"no image of recipe {recipe} in {root}")
    _cache.link_name(root, name, recipe)
    return img


def find_image(name_or_digest: str, cache: Path | None = None) -> GuestImage:
    """A cached image by recipe or content digest, or by the name it was built under
    (`base` for build_base)."""
    root = _cache.cache_root(cache)
    if (img := _cached(root, name_or_digest)) is not None:
        return img
    for d in (root / _cache.IMAGES / name_or_digest, root / "names" / name_or_digest):
        if (d / "manifest.json").is_file():
            return GuestImage.load(d.resolve())
    raise ImageError(f"no image {name_or_digest!r} in {root}")


def guest_defaults(image: GuestImage) -> dict[str, object]:
    """What envd's first /init tells the template's guest (`envVars`, `defaultUser`,
    `defaultWorkdir`): from the image's config; nothing for our own images."""
    d = image.manifest.get("guest", {}).get("defaults") or {}
    body: dict[str, object] = {}
    if d.get("env"):
        body["envVars"] = d["env"]
    if d.get("user"):
        body["defaultUser"] = d["user"]
    if d.get("workdir"):
        body["defaultWorkdir"] = d["workdir"]
    return body
