"""The guest kernel: Debian's stock amd64 kernel, booted as an uncompressed PVH ELF.

The package is fetched with `apt-get download` and unpacked with `dpkg-deb -x` into the
cache, never installed on the host. Debian's bzImage is XZ-compressed and its decompressor
costs ~4.5 s under TCG, so we keep the decompressed `vmlinux` and boot it through its PVH
entry instead. Only the handful of modules the initramfs needs are kept.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import lzma
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from . import elf
from .errors import ImageError
from .fsutil import remove_any

META_PACKAGE = "linux-image-amd64"
XZ_MAGIC = b"\xfd7zXZ\x00"

# In load order; dependencies found in modules.dep are pulled in ahead of their users.
REQUIRED_MODULES = (
    "virtio_ring",
    "virtio",
    "virtio_mmio",
    "virtio_blk",
    "failover",
    "net_failover",
    "virtio_net",
    "crc32c_generic",
    "crc16",
    "mbcache",
    "jbd2",
    "ext4",
)
# Loaded when present; a failure is reported (vmdebug=1) but does not stop the boot.
OPTIONAL_MODULES = ("virtio_balloon", "virtio_rng", "libcrc32c", "erofs", "overlay")


@dataclass(frozen=True)
class KernelPackage:
    """The concrete kernel package behind the `linux-image-amd64` meta package."""

    name: str  # linux-image-6.1.0-57-amd64
    version: str  # 6.1.192-3 (Debian package version)

    @property
    def release(self) -> str:
        """`uname -r` of the kernel, which names its /lib/modules directory."""
        return self.name.removeprefix("linux-image-")


@dataclass(frozen=True)
class ModuleSpec:
    """A module to put in the initramfs: its name, its file and whether boot needs it."""

    name: str
    path: Path  # an uncompressed .ko in the kernel cache
    required: bool


@dataclass(frozen=True)
class Kernel:
    """A cached, ready kernel: the PVH vmlinux and the modules in load order."""

    package: KernelPackage
    vmlinux: Path
    modules: tuple[ModuleSpec, ...]


def _run(argv: list[str], *, cwd: Path | None = None) -> str:
    try:
        proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    except FileNotFoundError as e:
        raise ImageError(f"{argv[0]} not found (is it installed? see scripts/setup.sh)") from e
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise ImageError(f"`{' '.join(argv)}` failed ({proc.returncode}): {' | '.join(tail)}")
    return proc.stdout


def parse_depends(text: str, meta: str = META_PACKAGE) -> str:
    """The `linux-image-<abi>-amd64` package named in `apt-cache depends` output."""
    for m in re.finditer(r"Depends:\s*(linux-image-[0-9][\w.+-]*)", text):
        return m.group(1)
    raise ImageError(f"apt-cache names no concrete kernel package for {meta}")


def resolve_package(progress: Callable[[str], None] = print) -> KernelPackage:
    """Ask apt (local lists; `apt-get update` once if there are none) which kernel to use."""
    try:
        text = _run(["apt-cache", "depends", META_PACKAGE])
        name = parse_depends(text)
    except ImageError:
        progress("apt lists missing or stale: apt-get update")
        _run(["apt-get", "update", "-q"])
        name = parse_depends(_run(["apt-cache", "depends", META_PACKAGE]))
    show = _run(["apt-cache", "show", "--no-all-versions", name])
    m = re.search(r"^Version:\s*(\S+)", show, re.M)
    if not m:
        raise ImageError(f"apt-cache show {name} has no Version")
    return KernelPackage(name, m.group(1))


def apt_state_stamp() -> str:
    """Changes whenever apt's view of available packages may have changed."""
    paths = [*Path("/var/lib/apt/lists").glob("*Packages*"), Path("/etc/apt/sources.list")]
    paths += Path("/etc/apt/sources.list.d").glob("*")
    parts = sorted(f"{p}:{p.stat().st_mtime_ns}" for p in paths if p.exists())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def resolve_package_cached(memo: Path, progress: Callable[[str], None] = print) -> KernelPackage:
    """`resolve_package`, remembered in `memo` until apt's lists change.

    apt-cache takes ~1 s here; a cache hit of `build_base` should not pay it every time.
    """
    stamp = apt_state_stamp()
    try:
        m = json.loads(memo.read_text())
        if m.get("stamp") == stamp:
            return KernelPackage(str(m["name"]), str(m["version"]))
    except (OSError, ValueError, KeyError):
        pass
    package = resolve_package(progress)
    tmp = memo.with_name(f".{memo.name}.{os.getpid()}")
    tmp.write_text(
        json.dumps({"stamp": apt_state_stamp(), "name": package.name, "version": package.version})
    )
    os.replace(tmp, memo)
    return package


def extract_vmlinux(bzimage: bytes) -> bytes:
    """The uncompressed kernel ELF inside an XZ-compressed bzImage; must have a PVH entry."""
    start = bzimage.find(XZ_MAGIC)
    if start < 0:
        raise ImageError("kernel image has no XZ payload (not an XZ-compressed bzImage?)")
    try:
        vmlinux = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(bzimage[start:])
    except lzma.LZMAError as e:
        raise ImageError(f"kernel XZ payload is corrupt: {e}") from e
    try:
        pvh = elf.has_pvh_entry(vmlinux)
    except elf.ElfFormatError as e:
        raise ImageError(f"decompressed kernel is not an x86-64 ELF: {e}") from e
    if not pvh:
        raise ImageError(
            "kernel ELF has no PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY, type 0x12); "
            "QEMU cannot boot it with -kernel vmlinux (needs CONFIG_PVH=y)"
        )
    return vmlinux


def module_name(path: str) -> str:
    """`kernel/fs/ext4/ext4.ko.xz` → `ext4`; `crc32c-intel.ko` → `crc32c_intel`."""
    base = path.strip().rsplit("/", 1)[-1]
    base = re.sub(r"\.ko(\.(xz|gz|zst))?$", "", base)
    return base.replace("-", "_")


def index_modules(moddir: Path) -> dict[str, Path]:
    """Every module file under a /lib/modules/<release> tree, by normalised name."""
    return {module_name(p.name): p for p in moddir.rglob("*.ko*") if module_name(p.name)}


def load_order(
    depends: Callable[[str], list[str] | None], builtin: Iterable[str], wanted: Iterable[str]
) -> list[str]:
    """Wanted modules plus their dependencies, each after what it depends on.

    `depends(name)` gives a module's dependencies, or None if there is no such module.
    Built-in ones are dropped (nothing to insmod); an unknown one is an error so that a
    kernel update that renames a module fails the build, not the boot.
    """
    builtin_set = {module_name(b) for b in builtin}
    order: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in order or name in builtin_set:
            return
        deps = depends(name)
        if deps is None:
            raise ImageError(f"kernel module {name} is neither a module file nor built in")
        if name in visiting:
            raise ImageError(f"module dependency cycle at {name}")
        visiting.add(name)
        for dep in deps:
            visit(module_name(dep))
        visiting.discard(name)
        order.append(name)

    for name in wanted:
        visit(name)
    return order


def _module_bytes(src: Path) -> bytes:
    # busybox insmod takes only plain .ko files
    if src.name.endswith(".ko.xz"):
        return lzma.decompress(src.read_bytes())
    if src.name.endswith(".ko.gz"):
        return gzip.decompress(src.read_bytes())
    if src.name.endswith(".ko.zst"):
        try:
            return subprocess.run(
                ["zstd", "-q", "-d", "-c", str(src)], capture_output=True, check=True
            ).stdout
        except (OSError, subprocess.CalledProcessError) as e:
            raise ImageError(f"cannot decompress {src.name} (needs zstd): {e}") from e
    return src.read_bytes()


def module_depends(data: bytes) -> list[str]:
    """A module's hard dependencies, from its `.modinfo` (what depmod would record)."""
    try:
        value = elf.modinfo(data).get("depends", "")
    except elf.ElfFormatError as e:
        raise ImageError(f"not a kernel module: {e}") from e
    return [d for d in value.split(",") if d]


def _load_cached(kdir: Path, package: KernelPackage) -> Kernel | None:
    meta_file = kdir / "kernel.json"
    if not meta_file.is_file():
        return None
    meta = json.loads(meta_file.read_text())
    mods = tuple(
        ModuleSpec(m["name"], kdir / "modules" / f"{m['name']}.ko", bool(m["required"]))
        for m in meta["modules"]
    )
    return Kernel(package, kdir / "vmlinux", mods)


def ensure_kernel(
    cache: Path, package: KernelPackage, progress: Callable[[str], None] = print
) -> Kernel:
    """The cached kernel for `package`, downloading and unpacking it on first use.

    Lives in `<cache>/kernel-<release>-<version>/` and is shared by every image; the caller
    holds the cache lock for that name.
    """
    kdir = cache / f"kernel-{package.release}-{package.version}"
    cached = _load_cached(kdir, package)
    if cached is not None:
        return cached
    work = Path(tempfile.mkdtemp(prefix=f".tmp-{kdir.name}-", dir=cache))
    try:
        progress(f"kernel: apt-get download {package.name}={package.version}")
        try:
            _run(["apt-get", "download", "-q", f"{package.name}={package.version}"], cwd=work)
        except ImageError as e:
            raise ImageError(f"{e} (stale apt lists? run apt-get update)") from e
        debs = sorted(work.glob("*.deb"))
        if not debs:
            raise ImageError(f"apt-get download produced no .deb for {package.name}")
        pkg = work / "pkg"
        progress(f"kernel: dpkg-deb -x {debs[0].name}")
        _run(["dpkg-deb", "-x", str(debs[0]), str(pkg)])
        out = work / "out"
        (out / "modules").mkdir(parents=True)
        bz = pkg / "boot" / f"vmlinuz-{package.release}"
        if not bz.is_file():
            raise ImageError(f"{debs[0].name} has no boot/vmlinuz-{package.release}")
        progress("kernel: extracting the PVH vmlinux from the bzImage")
        (out / "vmlinux").write_bytes(extract_vmlinux(bz.read_bytes()))
        moddir = pkg / "lib" / "modules" / package.release
        if not moddir.is_dir():  # usrmerged packages of later Debian releases
            moddir = pkg / "usr" / "lib" / "modules" / package.release
        # the package has no modules.dep (depmod runs at install), so read .modinfo
        paths = index_modules(moddir)
        blobs: dict[str, bytes] = {}

        def depends(name: str) -> list[str] | None:
            if name not in paths:
                return None
            blobs[name] = _module_bytes(paths[name])
            return module_depends(blobs[name])

        builtin_file = moddir / "modules.builtin"
        builtin = builtin_file.read_text().split() if builtin_file.is_file() else []
        required = set(load_order(depends, builtin, REQUIRED_MODULES))
        order = load_order(depends, builtin, (*REQUIRED_MODULES, *OPTIONAL_MODULES))
        for name in order:
            (out / "modules" / f"{name}.ko").write_bytes(blobs[name])
        meta = {
            "package": package.name,
            "version": package.version,
            "release": package.release,
            "modules": [{"name": n, "required": n in required} for n in order],
        }
        (out / "kernel.json").write_text(json.dumps(meta, indent=2) + "\n")
        remove_any(kdir)  # a stale, incomplete one (no kernel.json)
        os.replace(out, kdir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    kernel = _load_cached(kdir, package)
    if kernel is None:
        raise ImageError(f"kernel cache {kdir} is incomplete")
    return kernel
