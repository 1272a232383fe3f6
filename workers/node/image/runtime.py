"""envd's own runtime: a read-only disk every VM gets beside its root disk, mounted at
/opt/aenv, so envd never depends on the image it serves — busybox-only, musl or
old-Python images work the same as Debian.

The disk holds PID 1 (`init`) and a static busybox for it, envd's sources (byte-compiled),
and a Python of aenv's own: the interpreter, the parts of its standard library envd can
use, and every shared library they need down to the dynamic loader — all taken from the
cached Debian base tree, resolved by reading ELF headers (nothing is executed). envd runs
as `ld-linux --library-path <rt>/lib <rt>/bin/python3`, so the image's libc, loader and
Python are never involved; the processes envd starts for users run on the image's own.

Built once per (base tree, envd, boot scripts, busybox) and cached by digest like images:
`<cache>/runtime-<digest>/{runtime.ext4, manifest.json}`.
"""

from __future__ import annotations

import compileall
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from py_compile import PycInvalidationMode
from typing import Any

from shared.diskdigest import chunk_list

from . import cache as _cache
from .content import disk_stamp
from .disk import census, disk_uuid, make_ext4, root_size
from .elf import ElfFormatError, needed
from .errors import ImageError
from .initramfs import read_static_busybox, sha256_hex
from .inject import envd_files, envd_hash
from .leftovers import disk_full_error
from .rootfs import DebootstrapSpec
from .scripts import ENVD_DIR, GUEST_BUSYBOX, GUEST_INIT, GUEST_INIT_SCRIPT, RUNTIME_LABEL

__all__ = ["RuntimeDisk", "build_runtime", "find_runtime", "populate_runtime", "runtime_recipe"]

# 2: sized by `disk.root_size` (what the tree needs, no free space: read-only in the guest),
#    with a digest-derived UUID and a fixed mkfs clock.
FORMAT_VERSION = 2
#: Where the runtime sits inside the guest (the disk's root): the scripts' paths start here.
MOUNT = "/opt/aenv"
LOADER = "ld-linux-x86-64.so.2"
_LIB_DIRS = ("lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib64", "usr/lib")
#: Standard library parts envd has no use for (tests, GUIs, build tooling): ~60% of it.
_SKIP_STDLIB = frozenset(
    {
        "test",
        "idlelib",
        "tkinter",
        "turtledemo",
        "ensurepip",
        "lib2to3",
        "pydoc_data",
        "distutils",
        "venv",
        "site-packages",
        "dist-packages",
        "__pycache__",
        "turtle.py",
        "sitecustomize.py",
    }
)
#: Extension modules left out: test modules, and those pulling in libraries envd never uses.
_SKIP_DYNLOAD = (
    "_test",
    "_xx",
    "xx",
    "_ctypes_test",
    "ossaudiodev",
    "nis",
    "_curses",
    "readline",
    "_dbm",
    "_gdbm",
    "_sqlite3",
    "audioop",
    "_crypt",
    "_tkinter",
)

Progress = Callable[[str], None]


@dataclass(frozen=True)
class RuntimeDisk:
    """A built runtime disk in the cache."""

    digest: str
    path: Path  # raw ext4, attached read-only to every VM
    manifest: dict[str, Any]

    @property
    def content_digest(self) -> str | None:
        """The disk's content digest, recorded when it was built (None if it was built before)."""
        content = self.manifest.get("content") or {}
        return content.get("digest")

    @classmethod
    def load(cls, directory: Path) -> RuntimeDisk:
        try:
            manifest = json.loads((directory / "manifest.json").read_text())
        except (OSError, ValueError) as e:
            raise ImageError(f"{directory} is not a complete runtime: {e}") from e
        disk = directory / "runtime.ext4"
        if not disk.is_file():
            raise ImageError(f"runtime {directory} lacks runtime.ext4")
        return cls(manifest["digest"], disk, manifest)


def _python_version(tree: Path) -> str:
    found = sorted(p.name for p in (tree / "usr/lib").glob("python3.*") if (p / "os.py").exists())
    if not found:
        raise ImageError(f"{tree} has no python3 standard library to build envd's runtime from")
    return found[-1].removeprefix("python")


def _find_lib(tree: Path, soname: str) -> Path:
    for d in _LIB_DIRS:
        candidate = tree / d / soname
        if candidate.exists():
            return candidate.resolve()
    raise ImageError(f"envd runtime: shared library {soname} not found in {tree}")


def _closure(tree: Path, binaries: list[Path]) -> dict[str, Path]:
    """soname → file, for every library `binaries` need, transitively (the loader too)."""
    found: dict[str, Path] = {}
    todo = [b for b in binaries]
    while todo:
        try:
            names = needed(todo.pop().read_bytes())
        except ElfFormatError as e:
            raise ImageError(f"envd runtime: {e}") from e
        for soname in names:
            if soname not in found:
                found[soname] = _find_lib(tree, soname)
                todo.append(found[soname])
    found.setdefault(LOADER, _find_lib(tree, LOADER))
    return found


def _skip_stdlib(directory: str, names: list[str]) -> set[str]:
    skip = {n for n in names if n in _SKIP_STDLIB}
    if directory.endswith("lib-dynload"):
        skip |= {n for n in names if n.startswith(_SKIP_DYNLOAD)}
    # absolute links lead out of the tree (Debian's /etc/python3.x files)
    skip |= {
        n
        for n in names
        if os.path.islink(os.path.join(directory, n))
        and os.path.isabs(os.readlink(os.path.join(directory, n)))
    }
    return skip


def populate_runtime(tree: Path, dst: Path, *, envd_src: Path, busybox: bytes) -> dict[str, Any]:
    """Write the runtime's tree at `dst` (its root is the guest's /opt/aenv)."""
    version = _python_version(tree)
    py = dst / "python"
    stdlib = py / "lib" / f"python{version}"
    (py / "bin").mkdir(parents=True)
    shutil.copy2(tree / "usr/bin" / f"python{version}", py / "bin" / "python3")
    shutil.copytree(
        tree / "usr/lib" / f"python{version}", stdlib, symlinks=True, ignore=_skip_stdlib
    )
    modules = sorted((stdlib / "lib-dynload").glob("*.so"))
    libs = _closure(tree, [py / "bin" / "python3", *modules])
    for soname, src in sorted(libs.items()):
        shutil.copy2(src, py / "lib" / soname)
    for rel in envd_files(envd_src):
        target = dst / ENVD_DIR.removeprefix(MOUNT + "/") / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(envd_src / rel, target)
    (dst / "bin").mkdir()
    busybox_path = dst / GUEST_BUSYBOX.removeprefix(MOUNT + "/")
    busybox_path.write_bytes(busybox)
    busybox_path.chmod(0o755)
    init = dst / GUEST_INIT.removeprefix(MOUNT + "/")
    init.write_text(GUEST_INIT_SCRIPT)
    init.chmod(0o755)
    compiled = _compile(dst, version)
    return {"python": version, "libraries": sorted(libs), "compiled": compiled}


def _compile(dst: Path, version: str) -> bool:
    """Byte-compile everything once, here: the disk is read-only in the guest, and under
    TCG compiling envd and the stdlib modules it imports costs seconds per boot. Only when
    this interpreter writes the guest's bytecode version; unchecked hashes, because the
    disk is content-addressed and never changes under its .pyc files."""
    if f"{sys.version_info[0]}.{sys.version_info[1]}" != version:
        return False
    ok = compileall.compile_dir(
        str(dst),
        quiet=1,
        workers=1,
        invalidation_mode=PycInvalidationMode.UNCHECKED_HASH,
    )
    if not ok:
        raise ImageError("envd runtime: byte-compiling failed")
    return True


def _inputs(base_key: dict[str, object], envd_src: Path, busybox: bytes) -> dict[str, object]:
    return {
        "format": FORMAT_VERSION,
        "base": base_key,
        "envd": envd_hash(envd_src),
        "init": hashlib.sha256(GUEST_INIT_SCRIPT.encode()).hexdigest(),
        "busybox": sha256_hex(busybox),
        "host_python": f"{sys.version_info[0]}.{sys.version_info[1]}",  # decides .pyc
    }


def runtime_recipe(spec: DebootstrapSpec | None = None, envd_src: Path | None = None) -> str:
    """The recipe digest `build_runtime` builds (its cache key is `runtime-<recipe>`), from
    its inputs alone: what the fleet is asked for before anything is built."""
    from .build import default_envd_src

    spec = spec or DebootstrapSpec()
    envd_src = envd_src or default_envd_src()
    return _cache.digest_of(_inputs(spec.key(), envd_src, read_static_busybox()))


def build_runtime(
    cache: Path | None = None,
    *,
    progress: Progress = print,
    spec: DebootstrapSpec | None = None,
    envd_src: Path | None = None,
) -> RuntimeDisk:
    """envd's runtime disk: from the cache, or built from the base Debian tree."""
    from .build import base_rootfs_tree, default_envd_src

    root = _cache.cache_root(cache)
    spec = spec or DebootstrapSpec()
    envd_src = envd_src or default_envd_src()
    busybox = read_static_busybox()
    digest = runtime_recipe(spec, envd_src)
    key = f"runtime-{digest}"
    if (found := _cache.entry_dir(root, key)) is not None:
        return RuntimeDisk.load(found)
    tree = base_rootfs_tree(root, spec, progress)
    with _cache.locked(root, key):
        if (found := _cache.entry_dir(root, key)) is not None:
            return RuntimeDisk.load(found)
        t0 = time.monotonic()
        full = disk_full_error(f"build of envd's runtime disk in {root}")
        with _cache.staging(root, key) as tmp, full:
            progress("envd runtime: python, its libraries, envd, init ...")
            info = populate_runtime(tree, tmp / "tree", envd_src=envd_src, busybox=busybox)
            # read-only in every guest: nothing is ever written to it, so no free space
            counted = census(tmp / "tree")
            size = root_size(counted.need, 0)
            make_ext4(
                tmp / "tree",
                tmp / "runtime.ext4",
                size,
                label=RUNTIME_LABEL,
                fs_uuid=disk_uuid(digest),
                counted=counted,
            )
            shutil.rmtree(tmp / "tree")
            content = chunk_list(tmp / "runtime.ext4")
            manifest = {
                "digest": digest,
                # what the disk is (its bytes, `shared/diskdigest.py`); `digest` is the recipe
                "content": {
                    "digest": content.digest,
                    **content.as_json(),
                    "stamp": disk_stamp(tmp / "runtime.ext4"),
                },
                "inputs": _inputs(spec.key(), envd_src, busybox),
                "mount": MOUNT,
                "label": RUNTIME_LABEL,
                "size": size,
                **info,
                "build_seconds": round(time.monotonic() - t0, 1),
            }
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
            final = _cache.publish_content(root, tmp, key, content.digest)
    progress(f"envd runtime {digest[:12]} ready ({size >> 20} MiB disk)")
    return RuntimeDisk.load(final)


def find_runtime(digest: str, cache: Path | None = None) -> RuntimeDisk:
    """A runtime disk of this node by digest (a capture names the one it was taken with)."""
    d = _cache.entry_dir(_cache.cache_root(cache), f"runtime-{digest}")
    if d is None:
        raise ImageError(
            f"envd runtime {digest[:12]} is not on this node (build it with the "
            "same envd: `python -m workers.node.image build-runtime`)"
        )
    return RuntimeDisk.load(d)
