"""A real OCI registry on loopback for the tests (Debian's `docker-registry`, the CNCF
distribution server), open or behind basic auth, and images the tests make themselves from
trees they build (busybox-only; glibc binaries copied from this Debian host) and push with
skopeo. Tests reach no other registry."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from aenv.stack.process import free_port

__all__ = [
    "MACHINE_CACHE",
    "LocalRegistry",
    "busybox_tree",
    "debian_tree",
    "import_registry",
    "layout",
    "layout_with_big_file",
    "local_registry",
    "machine_base",
    "own_image_cache",
    "pattern_block",
    "push",
]


@dataclass(frozen=True)
class LocalRegistry:
    host: str  # 127.0.0.1:<port>
    username: str | None = None
    password: str | None = None

    def ref(self, repository: str, tag: str = "1") -> str:
        return f"{self.host}/{repository}:{tag}"


@contextmanager
def local_registry(root: Path, *, login: tuple[str, str] | None = None) -> Iterator[LocalRegistry]:
    """`docker-registry serve` on a free loopback port, its storage under `root`."""
    if shutil.which("docker-registry") is None or shutil.which("skopeo") is None:
        raise RuntimeError("docker-registry and skopeo are needed (scripts/setup.sh)")
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    auth = ""
    if login is not None:
        htpasswd = root / "htpasswd"
        line = subprocess.run(
            ["htpasswd", "-Bbn", *login], capture_output=True, text=True, check=True
        ).stdout
        htpasswd.write_text(line)
        auth = f"auth:\n  htpasswd:\n    realm: aenv-tests\n    path: {htpasswd}\n"
    (root / "config.yml").write_text(
        f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
        f"    rootdirectory: {root / 'data'}\n{auth}http:\n  addr: 127.0.0.1:{port}\n"
    )
    proc = subprocess.Popen(
        ["docker-registry", "serve", str(root / "config.yml")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1)
                break
            except urllib.error.HTTPError:
                break  # 401: up, and asking for the login
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the local registry did not start") from None
                time.sleep(0.1)
        user, password = login if login is not None else (None, None)
        yield LocalRegistry(f"127.0.0.1:{port}", user, password)
    finally:
        proc.terminate()
        proc.wait(10)


def push(layout: Path, registry: LocalRegistry, repository: str, tag: str = "1") -> str:
    """Push an OCI layout to the registry; the reference it can be pulled by."""
    ref = registry.ref(repository, tag)
    argv = ["skopeo", "copy", "--quiet", "--dest-tls-verify=false"]
    if registry.username is not None:
        argv += ["--dest-creds", f"{registry.username}:{registry.password}"]
    subprocess.run([*argv, f"oci:{layout}", f"docker://{ref}"], check=True, capture_output=True)
    return ref


def layout(out: Path, *trees: Path, config: dict[str, object] | None = None) -> Path:
    """An OCI layout at `out` with one layer per tree, bottom first."""
    from workers.node.image.oci_write import tar_tree, write_layout

    write_layout(out, [tar_tree(t) for t in trees], config=config)
    return out


def pattern_block(seed: bytes) -> bytes:
    """The 4 KiB block a big test file repeats: not zeros (mkfs skips zero blocks, so the
    disk would stay sparse), and gzip keeps 0.6 % of it (a 6 GiB layer is ~40 MB)."""
    return b"".join(hashlib.sha256(seed + i.to_bytes(4, "big")).digest() for i in range(128))


class _Pattern(io.RawIOBase):
    """`size` bytes of `block` over and over, read without holding them."""

    def __init__(self, block: bytes, size: int) -> None:
        self.block, self.left = block * 256, size  # 1 MiB per read

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        out = (self.block * (n // len(self.block) + 1))[:n]
        self.left -= n
        return out


class _Hashing(io.RawIOBase):
    """Writes through to `sink` (if any), hashing and counting what passes."""

    def __init__(self, sink: io.RawIOBase | gzip.GzipFile | None) -> None:
        self.sink, self.sha, self.count = sink, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, b: bytes) -> int:  # type: ignore[override]
        self.sha.update(b)
        self.count += len(b)
        if self.sink is not None:
            self.sink.write(b)
        return len(b)


def layout_with_big_file(
    out: Path, base: Path, path: str, size: int, seed: bytes
) -> tuple[Path, int]:
    """An OCI layout of `base` (one layer) and a second layer holding one `size`-byte file
    at `path` (`pattern_block(seed)` repeated), streamed to disk and never held in memory;
    with the image's uncompressed bytes (both layers' tars)."""
    from workers.node.image.oci_write import CONFIG, INDEX, LAYER_GZIP, MANIFEST, tar_tree

    blobs = out / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    (out / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}\n')

    def put(data: bytes) -> dict[str, object]:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return {"digest": f"sha256:{digest}", "size": len(data)}

    plain = tar_tree(base, compress=False)
    descs = [{"mediaType": LAYER_GZIP, **put(gzip.compress(plain, 1, mtime=0))}]
    diff_ids = ["sha256:" + hashlib.sha256(plain).hexdigest()]
    tmp = blobs / "big.tmp"
    with tmp.open("wb") as f:
        packed = _Hashing(f)  # type: ignore[arg-type]
        with gzip.GzipFile(fileobj=packed, mode="wb", compresslevel=1, mtime=0) as gz:
            tar = _Hashing(gz)
            with tarfile.open(fileobj=tar, mode="w|", format=tarfile.PAX_FORMAT) as tf:
                info = tarfile.TarInfo(path.lstrip("/"))
                info.size, info.mode, info.mtime = size, 0o644, 1_600_000_000
                dirs = Path(path.lstrip("/")).parents
                for d in reversed(list(dirs)[:-1]):
                    di = tarfile.TarInfo(str(d))
                    di.type, di.mode, di.mtime = tarfile.DIRTYPE, 0o755, 1_600_000_000
                    tf.addfile(di)
                tf.addfile(info, _Pattern(pattern_block(seed), size))
    digest = packed.sha.hexdigest()
    tmp.rename(blobs / digest)
    descs.append({"mediaType": LAYER_GZIP, "digest": f"sha256:{digest}", "size": packed.count})
    diff_ids.append("sha256:" + tar.sha.hexdigest())
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }
    cfg = {"mediaType": CONFIG, **put(json.dumps(config, sort_keys=True).encode())}
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST, "config": cfg, "layers": descs}
    man = {
        "mediaType": MANIFEST,
        **put(json.dumps(manifest, sort_keys=True).encode()),
        "annotations": {"org.opencontainers.image.ref.name": "latest"},
        "platform": {"architecture": "amd64", "os": "linux"},
    }
    index = {"schemaVersion": 2, "mediaType": INDEX, "manifests": [man]}
    (out / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    return out, len(plain) + tar.count


def busybox_tree(root: Path, *applets: str) -> Path:
    """A root with a static busybox and nothing else: no libc, no Python, no bash."""
    (root / "bin").mkdir(parents=True)
    shutil.copyfile("/bin/busybox", root / "bin/busybox")
    (root / "bin/busybox").chmod(0o755)
    for applet in ("sh", "ls", "cat", "echo", "id", "sleep", "uname", *applets):
        (root / "bin" / applet).symlink_to("busybox")
    (root / "etc").mkdir()
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\n")
    return root


def _shared_libs(binary: str) -> list[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    return re.findall(r"(/\S+) \(0x", out)


def debian_tree(root: Path, *programs: str) -> Path:
    """A usr-merged glibc root in Debian's layout: this Debian host's `programs` (bash and
    coreutils) with the libraries they load, its os-release, and nothing else."""
    for top, target in (
        ("bin", "usr/bin"),
        ("sbin", "usr/sbin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
    ):
        (root / target).mkdir(parents=True, exist_ok=True)
        (root / top).symlink_to(target)
    files = {shutil.which(p) or p for p in programs}
    for binary in list(files):
        files.update(_shared_libs(binary))
    for path in files:  # every file at its usr-merged place, as a regular file
        inside = path if path.startswith("/usr/") else "/usr" + path
        dst = root / inside.lstrip("/")
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(os.path.realpath(path), dst)
        dst.chmod(0o755)
    (root / "usr/bin/sh").symlink_to("bash")
    (root / "etc").mkdir()
    for name in ("os-release", "debian_version"):
        shutil.copyfile(Path("/etc") / name, root / "etc" / name)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (root / "etc/group").write_text("root:x:0:\n")
    for d in ("tmp", "root", "home"):
        (root / d).mkdir()
    (root / "tmp").chmod(0o1777)
    return root


#: the machine's image cache: `scripts/setup.sh` unpacks the guest kernel there
MACHINE_CACHE = Path("/var/lib/aenv/images")


def import_registry(tmp_path: Path) -> Iterator[LocalRegistry]:
    """A registry for tests that import images into a node's cache (mkfs of root-owned
    trees: root); skipped where the tools are missing. Yields from a fixture."""
    if os.geteuid() != 0:
        pytest.skip("mkfs of a tree with root-owned files needs root")
    if shutil.which("docker-registry") is None or shutil.which("skopeo") is None:
        pytest.skip("docker-registry and skopeo are needed (scripts/setup.sh)")
    with local_registry(tmp_path / "registry") as reg:
        yield reg


def machine_base() -> None:
    """The machine's base image and kernel, built where missing. A fresh checkout (CI) runs
    the tests that borrow them before the image tests build them: a skip there would hide
    those tests on every clean run."""
    if os.geteuid() != 0:
        pytest.skip("building the base image needs root (debootstrap, mkfs)")
    from workers.node.image import build_base

    build_base(MACHINE_CACHE, progress=lambda m: print(f"[image] {m}", flush=True))


def own_image_cache(root: Path) -> Path:
    """An empty image cache but for the machine's unpacked kernel (hard links): a node of
    its own, whose imports are all this test made."""
    resolved = MACHINE_CACHE / "kernel-resolved.json"
    kernels = list(MACHINE_CACHE.glob("kernel-*/"))
    if not resolved.is_file() or not kernels:
        machine_base()
        kernels = list(MACHINE_CACHE.glob("kernel-*/"))
    root.mkdir(parents=True)
    shutil.copy(resolved, root / resolved.name)
    for k in kernels:
        subprocess.run(["cp", "-al", str(k), str(root / k.name)], check=True)
    return root
