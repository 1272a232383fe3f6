"""Move the blocks of the directories a layer changes next to the layer's own data.

mkfs -d writes a directory's blocks among its files', so a layer that adds or removes a
name in ten base directories would rewrite ten 4 KiB blocks spread over the base: ten
chunks more for a second image to fetch. Before the layer's script runs, each such
directory's blocks are copied to the first free blocks (where libext2fs will put the
layer's data next: the same first fit) and its extents pointed there; the old blocks are
freed after the script. A directory block's checksum covers its inode and contents, not
its place, so the copy stays valid; `e2fsck -fn` checks the result anyway (`layerdisk`).

The block accounting goes through libext2fs's own allocator both ways (debugfs `setb` and
`freeb` leave the group counts stale): each extent's new blocks are a temporary file's,
claimed by `fallocate` in a move directory, and the directory's extent and the file's
trade places (`set_inode_field` on their `i_block` words), so removing the files after the
layer's script frees the old blocks with their counts.

Only directories whose extents all sit in the inode (depth 0, at most four) move; a
bigger one stays where it is (its changed block costs its chunk).

First fit would also put a layer's first blocks into the parent's holes (a few free
blocks mkfs leaves between files, or what an earlier layer freed), each in a chunk of
the parent's. So the holes below the first free run of at least a chunk (`frontier`) are
claimed first, by one more temporary file, and freed with the others after the script.
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Moves", "relocate"]

_EXTENT = re.compile(
    r"^\s*(\d+)/\s*(\d+)\s+(\d+)/\s*(\d+)\s+(\d+)\s*-\s*(\d+)\s+(\d+)\s*-\s*(\d+)\s+(\d+)\s*(\S*)\s*$"
)
#: names set_inode_field gives i_block[12..14]
_WORD = {12: "block[IND]", 13: "block[DIND]", 14: "block[TIND]"}


@dataclass
class Moves:
    """Commands to run before the layer's script (the extents trade places) and after it
    (the move directory and its files go, freeing the old blocks)."""

    before: list[str] = field(default_factory=list)
    after: list[str] = field(default_factory=list)
    dirs: int = 0
    blocks: int = 0
    holes: int = 0  # free blocks below the frontier, kept clear of the layer
    frontier: int = 0  # the first block of the first free run of 4 MiB or more


def block_size(disk: Path) -> int:
    """The ext4's block size, from its superblock (s_log_block_size)."""
    with disk.open("rb") as f:
        f.seek(1024 + 24)
        return 1024 << int(struct.unpack("<I", f.read(4))[0])


def _debugfs(disk: Path, commands: list[str], *, write: bool = False) -> list[list[str]]:
    """Each command's output lines (one debugfs run)."""
    proc = subprocess.run(
        ["debugfs", *(["-w"] if write else []), "-f", "-", str(disk)],
        input="\n".join(commands) + "\n",
        capture_output=True,
        text=True,
        check=False,
    )
    sections: list[list[str]] = []
    for line in proc.stdout.splitlines():
        if line.startswith("debugfs: "):
            sections.append([])
        elif sections:
            sections[-1].append(line)
    return sections


def _extents(lines: list[str], *, uninit: bool = False) -> list[tuple[int, int]] | None:
    """(physical start, length) of each extent, in i_block order; None if they cannot
    trade places (an extent tree, more than four, flags other than `uninit`'s)."""
    out = []
    for line in lines:
        m = _EXTENT.match(line)
        if m is None:
            continue
        if int(m.group(2)) != 0 or m.group(10) not in (("Uninit",) if uninit else ("",)):
            return None
        out.append((int(m.group(7)), int(m.group(9))))
    return out if 0 < len(out) <= 4 else None


def free_runs(disk: Path) -> list[tuple[int, int]]:
    """The disk's free blocks as sorted (start, length) runs (`dumpe2fs`, per group)."""
    proc = subprocess.run(["dumpe2fs", str(disk)], capture_output=True, text=True, check=False)
    runs = []
    for line in proc.stdout.splitlines():
        line = line.strip()
        if not line.startswith("Free blocks: "):
            continue
        for part in line.removeprefix("Free blocks: ").split(","):
            lo, _, hi = part.strip().partition("-")
            if lo.isdigit():
                runs.append((int(lo), int(hi or lo) - int(lo) + 1))
    return sorted(runs)


def frontier(runs: list[tuple[int, int]], bs: int) -> tuple[int, int]:
    """(first block of the first free run of at least 4 MiB, free blocks below it): where
    a layer's data should start, and the holes to keep clear of."""
    total = 0
    for start, n in runs:
        if n * bs >= 4 << 20:
            return start, total
        total += n
    return 0, 0  # no frontier: nothing to keep clear of


def scrub(disk: Path, parent: Path, below: int, keep: list[tuple[int, int]]) -> int:
    """Give every block of `disk` that is free, and below block `below`, the bytes
    `parent` has there, and so the `keep` runs (start, length): what a layer left in
    blocks it used and freed again (moved directory blocks, an extent block, the scratch
    entries) would otherwise make a chunk of the parent's differ. Blocks copied."""
    bs = block_size(disk)
    runs = [(s, min(n, below - s)) for s, n in free_runs(disk) if s < below] + keep
    done = 0
    src, dst = os.open(parent, os.O_RDONLY), os.open(disk, os.O_RDWR)
    try:
        for start, n in runs:
            for off in range(start, start + n, 256):  # 1 MiB at a time (4 KiB blocks)
                k = min(256, start + n - off)
                old = os.pread(src, k * bs, off * bs)
                if old != os.pread(dst, k * bs, off * bs):
                    os.pwrite(dst, old, off * bs)
                    done += k
        os.fsync(dst)
    finally:
        os.close(src)
        os.close(dst)
    return done


def extents(disk: Path, path: str) -> list[tuple[int, int]]:
    """(start, length) of the extents of `path` (quoted), if they sit in its inode."""
    [lines] = _debugfs(disk, [f"ex {path}"]) or [[]]
    return _extents(lines) or []


def _word(k: int) -> str:
    """The set_inode_field name of extent k's ee_start_lo (after the 3-word header)."""
    w = 5 + 3 * k
    return _WORD.get(w, f"block[{w}]")


def relocate(disk: Path, dirs: list[str], scratch: str, empty: Path) -> Moves:
    """Copy the blocks of `dirs` (absolute paths, quoted for debugfs) to the disk's first
    free blocks past its holes; what to run around the layer's script. `scratch`: an
    absolute path prefix for the temporary files (no name in the image starts with it);
    `empty`: an empty host file."""
    moves = Moves()
    bs = block_size(disk)
    filler = f'"{scratch}-holes"'
    claim = []
    moves.frontier, gaps = frontier(free_runs(disk), bs)
    if gaps > 0:  # first, so that nothing below lands in a hole
        claim = [f'write "{empty}" {filler}', f"fallocate {filler} 0 {gaps - 1}"]
    found = _debugfs(disk, [*claim, *(f"ex {d}" for d in dirs)], write=True)[len(claim) :]
    wanted = []  # (dir, extent index, old start, length)
    for d, lines in zip(dirs, found, strict=False):
        for k, (start, n) in enumerate(_extents(lines) or []):
            if start < 1 << 32:
                wanted.append((d, k, start, n))
    temp = [f'"{scratch}-{j}"' for j in range(len(wanted))]
    claim = []
    for t, (_, _, _, n) in zip(temp, wanted, strict=True):
        claim += [f'write "{empty}" {t}', f"fallocate {t} 0 {n - 1}", f"ex {t}"]
    got = _debugfs(disk, claim, write=True)[2::3] if claim else []
    moved: set[str] = set()
    fd = os.open(disk, os.O_RDWR)
    try:
        for (d, k, old, n), t, lines in zip(wanted, temp, got, strict=False):
            new = _extents(lines, uninit=True)
            if new is None or len(new) != 1 or new[0][1] != n or new[0][0] >= 1 << 32:
                continue  # not one run: the directory stays (its file just goes)
            os.pwrite(fd, os.pread(fd, n * bs, old * bs), new[0][0] * bs)
            moves.before += [f"sif {d} {_word(k)} {new[0][0]}", f"sif {t} {_word(0)} {old}"]
            moves.blocks += n
            moved.add(d)
        os.fsync(fd)
    finally:
        os.close(fd)
    moves.dirs, moves.holes = len(moved), gaps
    moves.after = [f"rm {t}" for t in temp] + [f"rm {filler}"] * (gaps > 0)
    return moves
