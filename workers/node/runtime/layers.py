"""Disk layers: qcow2 files stacked over a template's read-only base image (a raw file, or
a lazy base's stub over the node's block service: `shared/lazybase.py`).

A VM writes only to its top layer. Freezing (pause, snapshot, fork) turns the top into a
read-only layer and stacks a new one, so a snapshot's disk costs what changed since the
last one, and any number of children can share every frozen layer below their own top.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

from shared.lazybase import LAZY_ROOT, base_format, chain_to_base
from workers.node.image.cache import open_files
from workers.node.runtime.qcow2 import create_overlay
from workers.node.vmm.errors import VmmError

# Beyond this many qcow2 layers, every read walks too many tables: a pause compacts first.
MAX_CHAIN_DEPTH = int(os.environ.get("AENV_MAX_LAYER_DEPTH", "16"))


class LayerStore:
    """A directory of uniquely named qcow2 layers; backing paths inside are absolute."""

    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        # layer -> its backing file, for every layer created through this store
        self.backing: dict[Path, Path] = {}

    def new_path(self) -> Path:
        return self.root / f"{uuid.uuid4().hex}.qcow2"

    async def create_top(self, backing: Path, *, backing_raw: bool = False) -> Path:
        """A fresh empty qcow2 whose reads fall through to `backing` (`backing_raw`: the
        base image itself, a raw file or a lazy base's stub, which is a qcow2)."""
        top = self.new_path()
        create_overlay(top, backing.resolve(), base_format(backing) if backing_raw else "qcow2")
        self.backing[top] = backing
        return top

    def stacked(self, top: Path, backing: Path) -> None:
        """Record a layer QEMU created itself (blockdev-snapshot-sync) over `backing`."""
        self.backing[top] = backing

    def lineage(self, top: Path) -> list[Path]:
        """`top` and every layer under it that this store knows about."""
        out = [top]
        while out[-1] in self.backing:
            out.append(self.backing[out[-1]])
        return out

    async def chain(self, top: Path) -> list[Path]:
        """The backing chain from `top` down to the base, as QEMU resolves it, read from the
        layers' headers in a thread (a few bytes each). Not `qemu-img info --backing-chain`:
        under a lazy base it would open the block service's export too (a connection per
        GC, and a failure while the service restarts)."""
        try:
            return await asyncio.to_thread(chain_to_base, top)
        except ValueError as e:
            raise VmmError(str(e)) from e

    async def collect(self, roots: set[Path], *, min_age_s: float = 60) -> list[Path]:
        """Delete layers no root's chain needs; returns them. Chains are read from the files
        (qemu-img), so layers from before a restart are judged right; a layer younger than
        `min_age_s` is kept (a restore may be stacking on it this very moment), and so is
        one a process holds open: a QEMU opens its whole chain, and a VM whose restore is
        still under way (a warm VM restored at low priority on a busy node can take over a
        minute) is nobody's root yet — collecting its top left the template later captured
        from it without its disk."""
        live: set[Path] = set()
        for r in roots:
            if r.exists():
                live.update(await self.chain(r))
        held = await asyncio.to_thread(open_files)
        now = time.time()
        dead = [
            p
            for p in self.root.glob("*.qcow2")
            if p not in live
            and str(p.resolve()) not in held
            and now - p.stat().st_mtime > min_age_s
        ]
        for p in dead:
            p.unlink(missing_ok=True)
            self.backing.pop(p, None)
        return dead

    async def compact(self, top: Path) -> Path:
        """Flatten `top`'s chain above the base into one new qcow2 layer over that base:
        an empty overlay on `top`, rebased onto the base — qemu-img's (safe) rebase writes
        into it every cluster where the chain reads differently from the base, and only
        looks at the clusters allocated above the base, so it costs what the layers hold.

        Not `qemu-img convert -B base top`: with a backing file for its target, convert
        copies only what `top` itself allocates and takes the rest to equal the base — it
        dropped every write below the top layer (a cold boot of the disk, a filesystem-only
        pause's resume, read zeros where the files were)."""
        chain = await self.chain(top)
        base = chain[-1]
        flat = self.new_path()
        create_overlay(flat, top.resolve(), "qcow2")
        try:
            fmt = base_format(base)  # a lazy base: reads its blocks through the service
            await _qemu_img("rebase", "-q", "-b", str(base), "-F", fmt, str(flat))
        except BaseException:
            flat.unlink(missing_ok=True)
            raise
        self.backing[flat] = base
        return flat

    async def depth(self, top: Path) -> int:
        """qcow2 layers above the base (known chains in memory, else read from headers)."""
        known = self.lineage(top)
        if known[-1].suffix != ".qcow2" or known[-1].name == LAZY_ROOT:
            return len(known) - 1
        return len(await self.chain(top)) - 1


async def _qemu_img(*args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        "qemu-img", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise VmmError(f"qemu-img {args[0]} failed: {err.decode(errors='replace').strip()}")
    return out.decode()
