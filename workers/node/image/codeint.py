"""The `code-interpreter-v1` guest image: `base` plus a Jupyter kernel stack, the usual data
libraries and aenv's code-interpreter server (`codeint/`) started at boot.

Built like `base`, on the host, with no network inside any guest: the base debootstrap
tree is copied and Debian's packages are installed into the copy with apt (chroot); that
tree is cached by its inputs, so a change of the server's code rebuilds only the image
(seconds), never the apt step (minutes). The server runs on the image's own python3 — it
needs the image's ipykernel — as an image service (`/etc/aenv/services/`, started by PID 1
like envd, docs/guest-image.md), and listens on 49999 once its default Python kernel is
up and warmed: what the template's capture waits for (`templates.py`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
from pathlib import Path

from . import cache as _cache
from .build import (
    GuestImage,
    Progress,
    _assemble,
    _cached,
    _common,
    base_rootfs_tree,
    step,
)
from .disk import DEFAULT_FREE
from .errors import ImageError
from .oci_chains import link_tree
from .rootfs import (
    LOGIN_PROFILE_VERSION,
    DebootstrapSpec,
    apt_install,
    prune,
    tune_login_profile,
)

NAME = "code-interpreter"  # the image's name in the cache (`names/`)
TEMPLATE = "code-interpreter-v1"  # E2B's template name: what the SDK creates by default
PORT = 49999
#: Debian's packages of the kernel stack and the data libraries E2B's template carries
#: most often (numpy, pandas, matplotlib); no network is needed in the guest.
APT_PACKAGES = (
    "python3-ipykernel",
    "python3-jupyter-client",
    "python3-zmq",
    "python3-numpy",
    "python3-pandas",
    "python3-matplotlib",
    "python3-matplotlib-inline",
    "fonts-dejavu-core",
)
# Bumped when how the tree is made changes in a way the inputs do not capture.
TREE_VERSION = 1
GUEST_DIR = "usr/lib/aenv-codeint"  # the server's package lands in <this>/codeint/
SERVICE = "etc/aenv/services/code-interpreter"
_SERVICE_SCRIPT = f"""#!/bin/sh
# aenv's code-interpreter server (E2B's protocol on port {PORT}); started by PID 1
mkdir -p /run/codeint && chmod 755 /run/codeint
cd /{GUEST_DIR}
exec env PYTHONPATH=/{GUEST_DIR} PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3 -m codeint \\
  --port {PORT} --user user --rundir /run/codeint
"""


def codeint_src() -> Path:
    """The repository's `codeint/` package, located without importing it (guest code)."""
    spec = importlib.util.find_spec("codeint")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(__file__).resolve().parents[3] / "codeint"


def _sources(src: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(src.glob("*.py"))}


def _tree_key(spec: DebootstrapSpec) -> dict[str, object]:
    return {"base": spec.key(), "apt": sorted(APT_PACKAGES), "version": TREE_VERSION}


def codeint_tree(root: Path, progress: Progress) -> Path:
    """The base tree with the packages installed (cached; treat it as read-only)."""
    spec = DebootstrapSpec()
    key = f"rootfs-ci-{_cache.digest_of(_tree_key(spec))[:32]}"
    final = root / key
    if final.is_dir():
        return final
    base = base_rootfs_tree(root, spec, progress)
    with _cache.locked(root, key):
        if final.is_dir():
            return final
        with _cache.staging(root, key) as tmp, step(progress, "apt-get the kernel stack"):
            tree = tmp / "tree"
            # a real copy: dpkg and the byte-compiler write into the tree
            proc = subprocess.run(
                ["cp", "-a", str(base), str(tree)], capture_output=True, text=True
            )
            if proc.returncode != 0:
                raise ImageError(f"copying {base} failed: {proc.stderr.strip()[-300:]}")
            apt_install(tree, APT_PACKAGES, tmp / "apt.log", progress)
            prune(tree)
            os.rename(tree, final)
    return final


def _source() -> tuple[dict[str, object], dict[str, bytes]]:
    files = _sources(codeint_src())
    source: dict[str, object] = {
        "kind": "code-interpreter",
        "tree": _tree_key(DebootstrapSpec()),
        "server": hashlib.sha256(
            b"".join(n.encode() + b"\0" + d for n, d in files.items())
        ).hexdigest(),
        "service": hashlib.sha256(_SERVICE_SCRIPT.encode()).hexdigest(),
        "login_profile": LOGIN_PROFILE_VERSION,
    }
    return source, files


def code_interpreter_recipe(
    cache: Path | None = None, *, progress: Progress = print, free_bytes: int = DEFAULT_FREE
) -> str:
    """The recipe digest `build_code_interpreter` builds, from its inputs alone."""
    root = _cache.cache_root(cache)
    return _common(root, free_bytes, progress).recipe(_source()[0])


def build_code_interpreter(
    cache: Path | None = None, *, progress: Progress = print, free_bytes: int = DEFAULT_FREE
) -> GuestImage:
    """The code-interpreter image: from the cache, or built; recorded as `code-interpreter`."""
    root = _cache.cache_root(cache)
    common = _common(root, free_bytes, progress)
    source, files = _source()
    digest = common.recipe(source)
    img = _cached(root, digest)
    if img is None:
        tree = codeint_tree(root, progress)
        with _cache.locked(root, digest):
            img = _cached(root, digest)
            if img is None:

                def populate(dst: Path) -> None:
                    with step(progress, "link the code-interpreter tree, add the server"):
                        link_tree(tree, dst)
                        tune_login_profile(dst)
                        pkg = dst / GUEST_DIR / "codeint"
                        pkg.mkdir(parents=True)
                        for name, data in files.items():
                            (pkg / name).write_bytes(data)
                        service = dst / SERVICE
                        service.parent.mkdir(parents=True, exist_ok=True)
                        service.write_text(_SERVICE_SCRIPT)
                        service.chmod(0o755)

                img = _assemble(root, digest, common, source, populate, progress)
    else:
        progress(f"image {digest} is cached")
    _cache.link_name(root, NAME, digest)
    return img
