"""A real OCI registry on loopback for the tests (Debian's `docker-registry`, the CNCF
distribution server), open or behind basic auth, and images the tests make themselves from
trees they build (busybox-only; glibc binaries copied from this Debian host) and push with
skopeo. Tests reach no other registry."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from aenv.stack.process import free_port

__all__ = ["LocalRegistry", "busybox_tree", "debian_tree", "layout", "local_registry", "push"]


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
