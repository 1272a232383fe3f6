"""The node's unpacked-layer cache: the tree after each layer of an image kept under its
chain id (hard links), so layers two images share are unpacked once (`oci.unpack`).

Hard links are safe because unpacking never writes into an existing file (it unlinks and
creates), and directories are copied, not linked. The cache is an optimisation: a tree
that cannot be kept is simply not kept.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from .errors import ImageError

__all__ = ["chain_dir", "chain_ids", "keep_chain", "link_tree"]


def chain_ids(diff_ids: list[str]) -> list[str]:
    """Docker's chain ids: layer i's names the whole stack 0..i (sha256 of the previous
    chain id, a space, this diff id), so equal prefixes of two images are one chain."""
    out: list[str] = []
    for diff_id in diff_ids:
        out.append(
            diff_id
            if not out
            else "sha256:" + hashlib.sha256(f"{out[-1]} {diff_id}".encode()).hexdigest()
        )
    return out


def chain_dir(cache: Path | None, chain: str) -> Path:
    """Where the tree after a chain's layers is kept (public: a benchmark empties it to
    measure a cold unpack)."""
    assert cache is not None
    return cache / chain.replace(":", "-")


def keep_chain(cache: Path | None, chain: str, tree: Path) -> bool:
    """The tree as it is after this layer, into the cache (hard links; published whole).
    Whether this call put it there (a failed import's ledger removes what it made)."""
    final = chain_dir(cache, chain)
    if (final / "ok").is_file():
        return False
    tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        link_tree(tree, tmp / "tree")
        (tmp / "ok").write_text(chain + "\n")
        shutil.rmtree(final, ignore_errors=True)  # an incomplete one from a crash
        os.rename(tmp, final)
    except (OSError, ImageError):
        shutil.rmtree(tmp, ignore_errors=True)  # the cache is an optimisation: go on without
        return False
    return True


def link_tree(src: Path, dst: Path) -> None:
    proc = subprocess.run(["cp", "-al", str(src), str(dst)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ImageError(f"copying {src} failed: {proc.stderr.strip()[-300:]}")
