"""Root disks that share blocks (issue 29, "layers share blocks").

An image's root disk used to be a fresh `mkfs.ext4 -d` of its whole tree, so two images on
one base shared almost none of their 4 MiB chunks (mkfs lays files out in the order it
walks them). Now each kept layer chain (`oci_chains`) also keeps an ext4 of its tree,
`layers/<chain>/root-<free>.ext4`: the first layer's is made by mkfs, every later one is a
sparse copy of its parent's with the layer applied by `debugfs -w` (`layerplan`: no mount,
no root mount needed), and an image's root disk is its top chain's with the guest
injection applied the same way. Bytes a layer did not change stay where the parent had
them, so the chunks of two images on one base are the same but for what their own layers
(and the injection) wrote: the repository stores, and the block service fetches, those.

Every derived disk must pass `e2fsck -fn`. Anything the script cannot express (a socket,
a name debugfs cannot quote), a debugfs error, a failed check or `AENV_LAYERED_DISKS=off`
makes the disk afresh as before, with a log line saying why. The disk keys carry the
root disk's free bytes (`free`): the base disk is sized like a fresh one (`root_size`), and
a child that needs more is grown with `resize2fs` (new groups at the end: the old chunks
stay as they were). Its UUID is the first chain's (`disk_uuid` of the chain id).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .dirblocks import extents, relocate, scrub
from .disk import Census, census, make_ext4, root_size
from .errors import ImageError
from .layerplan import Unsupported, plan, quoted, snapshot, xattrs_of
from .oci_chains import chain_dir

__all__ = ["ENV", "ChainDisks", "Derived", "derive", "enabled", "root_disk"]

log = logging.getLogger(__name__)

#: `off`: every root disk is a fresh mkfs (the old path)
ENV = "AENV_LAYERED_DISKS"

Progress = Callable[[str], None]

_BENIGN = re.compile(r"^(debugfs \d.*|Allocated inode: \d+|\s*)$")


def enabled() -> bool:
    """Whether root disks are derived from their layer chains' (`AENV_LAYERED_DISKS`)."""
    return os.environ.get(ENV, "on").strip().lower() not in ("off", "0", "false", "no")


def _run(argv: list[str], what: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False)
    except FileNotFoundError as e:
        raise Unsupported(f"{what}: {argv[0]} not found (apt-get install e2fsprogs)") from e


def sparse_copy(src: Path, dst: Path) -> None:
    """`dst` as a copy of `src` that allocates only `src`'s data (a reflink where the
    filesystem can)."""
    proc = _run(["cp", "--reflink=auto", "--sparse=always", str(src), str(dst)], "copy")
    if proc.returncode != 0:
        raise ImageError(f"copying {src} failed: {proc.stderr.strip()[-300:]}")


def _grow(disk: Path, size: int) -> bool:
    if size <= disk.stat().st_size:
        return False
    with disk.open("r+b") as f:
        f.truncate(size)
    proc = _run(["resize2fs", "-f", str(disk)], "grow")
    if proc.returncode != 0:
        raise Unsupported(f"resize2fs to {size >> 20} MiB failed: {proc.stderr.strip()[-300:]}")
    return True


@dataclass(frozen=True)
class Derived:
    """What one derivation did (recorded in the image manifest)."""

    written: int
    written_bytes: int
    removed: int
    moved_dirs: int
    holes: int
    scrubbed: int
    commands: int
    grown: bool
    seconds: float

    def as_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def derive(parent: Path, before: Path, after: Path, out: Path, size: int) -> Derived:
    """`out`: the ext4 `parent` (which holds tree `before`) turned into one holding tree
    `after`, at least `size` bytes. Raises `Unsupported` (or ImageError) and leaves `out`
    half made when it cannot; the caller removes it."""
    t0 = time.monotonic()
    sparse_copy(parent, out)
    grown = _grow(out, size)
    steps = plan(
        snapshot(before),
        snapshot(after),
        lambda rel: str(after / rel),
        lambda rel: os.lstat(after / rel).st_size,
    )
    with tempfile.TemporaryDirectory(prefix=".debugfs-", dir=out.parent) as tmp:
        (Path(tmp) / "empty").touch()
        dirs = [quoted(d) for d in sorted(steps.touched)]
        # the scratch directory's blocks: emptied again at the end, given back their bytes
        scratch = extents(out, quoted(steps.trash.rpartition("/")[0])) if "/" in steps.trash else []
        moves = relocate(out, dirs, "/" + steps.trash, Path(tmp) / "empty")
        lines = moves.before + steps.commands
        for i, (rel, known) in enumerate(steps.xattrs):
            attrs = known or xattrs_of(after / rel)
            for j, (name, value) in enumerate(attrs):
                value_file = Path(tmp) / f"{i}-{j}"
                value_file.write_bytes(value)
                lines.append(f'ea_set -f "{value_file}" "/{rel}" "{name}"')
        lines += moves.after  # the old directory blocks: free only now
        script = Path(tmp) / "script"
        script.write_text("\n".join(lines) + "\n", errors="surrogateescape")
        proc = _run(["debugfs", "-w", "-f", str(script), str(out)], "debugfs")
    errors = [line for line in proc.stderr.splitlines() if not _BENIGN.match(line)]
    if proc.returncode != 0 or errors:
        raise Unsupported(f"debugfs: {'; '.join(errors[:3]) or proc.returncode}")
    scrubbed = scrub(out, parent, moves.frontier, scratch)
    check = _run(["e2fsck", "-fn", str(out)], "check")
    if check.returncode != 0:
        said = [line for line in check.stdout.splitlines() if line and not line.startswith("Pass ")]
        raise Unsupported(f"e2fsck -fn found errors: {' / '.join(said[:4])}")
    return Derived(
        written=steps.written,
        written_bytes=steps.written_bytes,
        removed=steps.removed,
        moved_dirs=moves.dirs,
        holes=moves.holes,
        scrubbed=scrubbed,
        commands=len(lines),
        grown=grown,
        seconds=round(time.monotonic() - t0, 2),
    )


def _fs_uuid(chain: str) -> uuid.UUID:
    return uuid.UUID(chain.split(":", 1)[-1][:32])


class ChainDisks:
    """The ext4 of each layer chain an import keeps (`layers/<chain>/root-<free>.ext4`),
    each derived from its parent's (`derive`), or made by mkfs for the first layer and for
    a chain whose parent has none. An optimisation: a disk that cannot be made is not
    made, and the image's root disk is then made afresh."""

    def __init__(self, cache: Path, free: int, work: Path, progress: Progress) -> None:
        self.cache, self.free, self.work, self.progress = cache, free, work, progress

    def path(self, chain: str) -> Path:
        return chain_dir(self.cache, chain) / f"root-{self.free}.ext4"

    def tree(self, chain: str) -> Path:
        return chain_dir(self.cache, chain) / "tree"

    def top(self, chain: str) -> tuple[Path, Path] | None:
        """(disk, tree) of `chain`, when both are kept."""
        disk, tree = self.path(chain), self.tree(chain)
        return (disk, tree) if disk.is_file() and tree.is_dir() else None

    def build(self, chains: list[str], i: int) -> None:
        """Chain `i`'s disk, once its tree is kept (nothing if it is there, or the tree
        is not)."""
        chain = chains[i]
        target = self.path(chain)
        if not enabled() or target.is_file() or not (chain_dir(self.cache, chain) / "ok").is_file():
            return
        self.work.mkdir(parents=True, exist_ok=True)
        tmp = self.work / f".chain-{os.getpid()}-{i}.ext4"
        parent = self.top(chains[i - 1]) if i > 0 else None
        label = f"chain {chain[7:19]}"
        t0 = time.monotonic()
        try:
            counted = census(self.tree(chain))
            size = root_size(counted.need, self.free)
            if parent is None:
                make_ext4(self.tree(chain), tmp, size, fs_uuid=_fs_uuid(chain), counted=counted)
                how = "mkfs"
            else:
                d = derive(parent[0], parent[1], self.tree(chain), tmp, size)
                how = f"from its parent's ({d.written} files, {d.written_bytes >> 20} MiB)"
            os.replace(tmp, target)
        except (Unsupported, ImageError, OSError, ValueError) as e:
            tmp.unlink(missing_ok=True)
            log.warning("no disk for layer %s of this image (%s): %s", i, label, e)
            self.progress(f"layer disk: none for layer {i} ({e})")
            return
        self.progress(f"layer disk: layer {i} {how} in {time.monotonic() - t0:.1f}s")


def root_disk(
    tree: Path,
    out: Path,
    size: int,
    *,
    fs_uuid: uuid.UUID,
    counted: Census,
    base: tuple[Path, Path] | None,
    progress: Progress,
) -> dict[str, Any]:
    """The image's root disk at `out`: `base` (its top chain's disk and tree) with the
    difference to `tree` applied, or a fresh mkfs. What was done, for the manifest."""
    if base is not None and enabled():
        try:
            d = derive(base[0], base[1], tree, out, size)
        except (Unsupported, ImageError, OSError, ValueError) as e:
            out.unlink(missing_ok=True)
            log.warning("root disk made afresh (layered disk failed): %s", e)
            progress(f"root disk: afresh, the layered one failed ({e})")
        else:
            return {"from": "layers", **d.as_json()}
    elif base is None and enabled():
        log.info("root disk made afresh: no disk of the image's layers is kept")
    make_ext4(tree, out, size, fs_uuid=fs_uuid, counted=counted)
    return {"from": "mkfs"}
