"""The default root filesystem: a pruned Debian `minbase` tree made by debootstrap.

debootstrap takes about a minute, so its tree is cached on its own (keyed by suite,
mirror and package list) and every image built from it copies the tree, injects aenv's
files and makes a fresh ext4: changing envd never re-runs debootstrap.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ImageError
from .fsutil import remove_any, unmount_under, write_guest_file

DEFAULT_SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_PACKAGES = (
    "python3",
    "bash",
    "coreutils",
    "procps",
    "iproute2",
    "ca-certificates",
    "sudo",
    # what E2B's base image carries and agents' code assumes: git (the SDK's `sbx.git`
    # helpers), curl, a `python` command, pip and venv
    "git",
    "curl",
    "python-is-python3",
    "python3-pip",
    "python3-venv",
)
#: Installed with apt inside the tree once debootstrap is done: debootstrap's own resolver
#: cannot configure npm's graph of node-* packages (virtual provides), apt can.
DEFAULT_APT_PACKAGES = ("nodejs", "npm")
# Bumped when the pruning below changes, so cached trees are rebuilt.
PRUNE_VERSION = 1
_PRUNE = (
    "var/cache/apt/archives/*.deb",
    "var/cache/apt/*.bin",
    "var/lib/apt/lists/*",
    "usr/share/doc/*",
    "usr/share/man/*",
    "usr/share/locale/*",
    "usr/share/info/*",
    "var/log/*.log",
    "var/log/apt/*",
)


@dataclass(frozen=True)
class DebootstrapSpec:
    """What goes into the default rootfs; its fields are part of the image digest."""

    suite: str = DEFAULT_SUITE
    mirror: str = DEFAULT_MIRROR
    packages: tuple[str, ...] = field(default=DEFAULT_PACKAGES)
    apt_packages: tuple[str, ...] = field(default=DEFAULT_APT_PACKAGES)
    variant: str = "minbase"

    def key(self) -> dict[str, object]:
        """The digest inputs: everything that changes the produced tree."""
        return {
            "kind": "debootstrap",
            "suite": self.suite,
            "mirror": self.mirror,
            "variant": self.variant,
            "packages": sorted(self.packages),
            "apt_packages": sorted(self.apt_packages),
            "prune": PRUNE_VERSION,
        }


def prune(tree: Path) -> None:
    """Drop apt lists and caches, docs, man pages and locales (~270 MB → ~130 MB)."""
    for pattern in _PRUNE:
        for p in tree.glob(pattern):
            remove_any(p)


def debootstrap(
    spec: DebootstrapSpec, target: Path, log: Path, progress: Callable[[str], None] = print
) -> None:
    """Run debootstrap into `target` (must not exist or be empty), then prune it.

    Output goes to `log`; a failure raises with the log's last lines. Whatever debootstrap
    mounted inside the target is unmounted in every case.
    """
    argv = [
        "debootstrap",
        f"--variant={spec.variant}",
        f"--include={','.join(spec.packages)}",
        spec.suite,
        str(target),
        spec.mirror,
    ]
    progress(f"rootfs: {' '.join(argv)}")
    try:
        with log.open("wb") as out:
            proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False)
    except FileNotFoundError as e:
        raise ImageError("debootstrap not found (apt-get install debootstrap)") from e
    finally:
        unmount_under(target)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        raise ImageError(f"debootstrap failed ({proc.returncode}): {' | '.join(tail)}")
    if spec.apt_packages:
        apt_install(target, spec.apt_packages, log, progress)
    prune(target)


def apt_install(
    target: Path, packages: tuple[str, ...], log: Path, progress: Callable[[str], None]
) -> None:
    """`apt-get install` inside the tree (chroot, its /proc mounted, the host's resolver
    copied in for the download and taken out again)."""
    progress(f"rootfs: apt-get install {' '.join(packages)} (in the tree)")
    resolv = target / "etc" / "resolv.conf"
    saved = resolv.read_bytes() if resolv.is_file() and not resolv.is_symlink() else None
    shutil.copyfile("/etc/resolv.conf", resolv, follow_symlinks=True)
    (target / "proc").mkdir(exist_ok=True)
    script = (
        "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
        f"--no-install-recommends {' '.join(packages)} && apt-get clean"
    )
    try:
        subprocess.run(
            ["mount", "-t", "proc", "proc", str(target / "proc")], check=True, capture_output=True
        )
        with log.open("ab") as out:
            proc = subprocess.run(
                ["chroot", str(target), "/bin/sh", "-c", script],
                stdout=out,
                stderr=subprocess.STDOUT,
                check=False,
            )
    finally:
        unmount_under(target)
        if saved is not None:
            resolv.write_bytes(saved)
        else:
            resolv.unlink(missing_ok=True)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        raise ImageError(
            f"apt-get install in the tree failed ({proc.returncode}): {' | '.join(tail)}"
        )


#: Bumped when `tune_login_profile` changes: part of the images' digest inputs.
LOGIN_PROFILE_VERSION = 1


def tune_login_profile(tree: Path) -> bool:
    """Debian's /etc/profile asks `id -u` for the uid in a subshell: every login shell —
    and the E2B SDK runs each command as `bash -l -c` — forks and execs `id` for it, some
    40 ms under an emulated CPU (a third of a warm sandbox's command). bash knows the uid
    without a process (`$EUID`); other shells (dash's `sh -l`) still ask `id`. The file is
    replaced, not edited: the tree's files may be hard links into a cached tree. Returns
    whether it changed anything."""
    profile = tree / "etc" / "profile"
    try:
        text = profile.read_text()
    except OSError:
        return False
    tuned = text.replace('"$(id -u)"', '"${EUID:-$(id -u)}"')
    if tuned == text:
        return False
    write_guest_file(tree, "/etc/profile", tuned.encode(), mode=0o644)
    return True
