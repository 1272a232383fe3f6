"""The default root filesystem: a pruned Debian `minbase` tree made by debootstrap.

debootstrap takes about a minute, so its tree is cached on its own (keyed by suite,
mirror and package list) and every image built from it copies the tree, injects aenv's
files and makes a fresh ext4: changing envd never re-runs debootstrap.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ImageError
from .fsutil import remove_any, unmount_under

DEFAULT_SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_PACKAGES = (
    "python3", "bash", "coreutils", "procps", "iproute2", "ca-certificates", "sudo",
)  # fmt: skip
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
    variant: str = "minbase"

    def key(self) -> dict[str, object]:
        """The digest inputs: everything that changes the produced tree."""
        return {
            "kind": "debootstrap",
            "suite": self.suite,
            "mirror": self.mirror,
            "variant": self.variant,
            "packages": sorted(self.packages),
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
    prune(target)
