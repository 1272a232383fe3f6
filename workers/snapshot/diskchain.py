"""qcow2 backing chains: read who backs whom, and re-point a layer at its new backing file.

A frozen layer's header names its backing file by absolute path, valid only on the node
that wrote it. We read headers in-process (a few bytes each) to validate and walk chains,
and on download rewrite the backing path with `qemu-img rebase -u`, which changes only
metadata; the data clusters are untouched, so the restored chain reads exactly as before.
"""

from __future__ import annotations

import asyncio
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from shared.lazybase import QCOW2_MAGIC, is_lazy_base, qcow2_backing
from workers.snapshot.errors import LayoutError

MAX_DEPTH = 64  # a longer chain is a loop or a bug; the node compacts at 16


@dataclass(frozen=True)
class Backing:
    """What a qcow2 header says lies under it."""

    path: Path | None
    format: str | None


def read_backing(path: Path) -> Backing:
    """Parse `path`'s qcow2 header (v2/v3) for its backing file name and format."""
    try:
        found = qcow2_backing(path)
    except (OSError, ValueError, struct.error) as e:
        raise LayoutError(f"disk layer {path} unreadable: {e}") from e
    if found is None:
        raise LayoutError(f"{path} is not a qcow2 image")
    name, fmt = found
    if name is None:
        return Backing(None, None)
    backing = Path(name)
    if not backing.is_absolute():  # qemu resolves relative names against the layer's dir
        backing = path.parent / backing
    return Backing(backing, fmt)


def walk_chain(top: Path) -> tuple[list[Path], Path]:
    """(qcow2 layers bottom->top, base) of the chain ending at `top`.

    The chain must end in a raw file or a lazy base's stub (`shared/lazybase.py`): that is
    the template's base image, which is identified by digest rather than uploaded.
    """
    layers = [top]
    while len(layers) <= MAX_DEPTH:
        b = read_backing(layers[-1])
        if b.path is None:
            raise LayoutError(f"{layers[-1]} has no backing file: the chain has no raw base")
        if b.format == "raw" or (b.format is None and not _is_qcow2(b.path)):
            return layers[::-1], b.path
        if is_lazy_base(b.path):
            return layers[::-1], b.path
        layers.append(b.path)
    raise LayoutError(f"backing chain of {top} is deeper than {MAX_DEPTH}")


def check_chain(layers: list[Path]) -> Path:
    """Check `layers` (bottom->top) form one chain; returns the base under the bottom (a raw
    file or a lazy base's stub)."""
    if not layers:
        raise LayoutError("no disk layers given")
    below: Path | None = None
    base: Path | None = None
    for layer in layers:
        b = read_backing(layer)
        if b.path is None:
            raise LayoutError(f"{layer} has no backing file")
        if below is None:
            lazy = is_lazy_base(b.path)
            if not lazy and (b.format not in ("raw", None) or _is_qcow2(b.path)):
                raise LayoutError(f"bottom layer {layer} must sit on the raw base, not {b.path}")
            base = b.path
        elif not _same(b.path, below):
            raise LayoutError(f"{layer} is backed by {b.path}, expected {below}")
        below = layer
    assert base is not None
    return base


def backed(layer: Path) -> bool:
    """Whether the file `layer` names as its backing is there."""
    b = read_backing(layer)
    return b.path is None or b.path.exists()


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


def _is_qcow2(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == QCOW2_MAGIC
    except OSError as e:
        raise LayoutError(f"backing file {path} unreadable: {e}") from e


async def rebase_unsafe(layer: Path, backing: Path, backing_format: str) -> None:
    """Point `layer` at `backing` without touching data (`qemu-img rebase -u`)."""
    proc = await asyncio.create_subprocess_exec(
        "qemu-img",
        "rebase",
        "-u",
        "-b",
        str(backing),
        "-F",
        backing_format,
        "-f",
        "qcow2",
        str(layer),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise LayoutError(f"qemu-img rebase {layer}: {err.decode(errors='replace').strip()}")
