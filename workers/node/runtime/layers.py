"""Disk layers: qcow2 files stacked over a template's read-only raw base image.

A VM writes only to its top layer. Freezing (pause, snapshot, fork) turns the top into a
read-only layer and stacks a new one, so a snapshot's disk costs what changed since the
last one, and any number of children can share every frozen layer below their own top.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

from workers.node.runtime.qcow2 import create_overlay
from workers.node.vmm.errors import VmmError

MAX_CHAIN_DEPTH = 16  # beyond this, reads walk too many tables: compact first


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
        """A fresh empty qcow2 whose reads fall through to `backing`."""
        top = self.new_path()
        create_overlay(top, backing.resolve(), "raw" if backing_raw else "qcow2")
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

    def collect(self, roots: set[Path]) -> list[Path]:
        """Delete store layers that no root's chain needs; returns what was deleted.

        Roots are the tops of live VMs and of snapshots someone still holds. A frozen
        layer under a running VM is live even when the snapshot that froze it is gone.
        """
        live: set[Path] = set()
        for r in roots:
            live.update(self.lineage(r))
        dead = [p for p in self.root.glob("*.qcow2") if p not in live]
        for p in dead:
            p.unlink(missing_ok=True)
            self.backing.pop(p, None)
        return dead

    async def chain(self, top: Path) -> list[Path]:
        """The backing chain from `top` down to the base, as QEMU resolves it."""
        out = await _qemu_img("info", "--backing-chain", "--output=json", "-U", str(top))
        return [Path(layer["filename"]) for layer in json.loads(out)]

    async def compact(self, top: Path) -> Path:
        """Flatten `top`'s chain above the raw base into one new qcow2 layer over that base."""
        chain = await self.chain(top)
        base = chain[-1]
        flat = self.new_path()
        await _qemu_img(
            "convert", "-q", "-O", "qcow2", "-B", str(base), "-F", "raw", str(top), str(flat)
        )
        return flat


async def _qemu_img(*args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        "qemu-img", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise VmmError(f"qemu-img {args[0]} failed: {err.decode(errors='replace').strip()}")
    return out.decode()
