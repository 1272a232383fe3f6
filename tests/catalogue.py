"""The catalogue test's parts (issue 42, images-at-scale §4): its size from the environment,
the payload layers (files of one 4 KiB block repeated, a per-file seed, and a `SHA256SUMS`
the guest checks: gzip keeps 0.6 % of them, so the registry stays small while the node's
ext4 holds them at full size), and the sampler of a node's disk use.

`AENV_CATALOGUE` picks the form: unset or `small`, the reduced form the suite (CI) runs, ~5
minutes on a 2-core machine; `off`, the test is skipped; anything else is the issue's full
form (`make test-catalogue`). Each number can
be set on its own (`AENV_CATALOGUE_IMAGES`, `_SHARED_MIB`, `_DISTINCT_MIB` as `lo-hi`,
`_BUDGET_MIB`)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from tests.registry import pattern_block
from workers.node.disk.categories import IMAGES, STATE
from workers.node.disk.usage import scan

__all__ = ["Form", "Sampler", "form_from_env", "ledger_near", "payload", "sizes"]

MiB = 1 << 20
#: a payload file's size (the last one of a layer is shorter)
FILE = 16 * MiB


@dataclass(frozen=True)
class Form:
    images: int
    shared: int  # bytes of the layer every image has
    distinct: tuple[int, int]  # bytes of each image's own layer: lowest, highest
    budget: int  # the measured node's disk budget

    @property
    def catalogue(self) -> int:
        """Uncompressed payload bytes of all images together (the mean distinct layer)."""
        return self.images * (self.shared + sum(self.distinct) // 2)


#: the issue's numbers: ≥ 40 images, a ≥ 400 MiB shared layer, 50-300 MiB each, 3 GiB
#: budget and a catalogue ≥ 10x it (so more than 40 images: 54 x 575 MiB ≈ 30 GiB)
FULL = Form(54, 400 * MiB, (50 * MiB, 300 * MiB), 3072 * MiB)
#: minutes here: 8 x ~390 MiB ≈ 3 GiB under a 2 GiB budget, of which a node holds ~750 MiB
#: before any create (the base image, the runtime disk, the kernel): 2.4x what is left, and
#: one image's create asks ~730 MiB of room (its disk, its capture, the headroom)
SMALL = Form(8, 192 * MiB, (128 * MiB, 256 * MiB), 2048 * MiB)


def form_from_env() -> Form | None:
    which = os.environ.get("AENV_CATALOGUE", "small")
    if which == "off":
        return None
    base = SMALL if which in ("", "small") else FULL
    lo, _, hi = os.environ.get("AENV_CATALOGUE_DISTINCT_MIB", "").partition("-")
    return Form(
        int(os.environ.get("AENV_CATALOGUE_IMAGES", base.images)),
        int(os.environ.get("AENV_CATALOGUE_SHARED_MIB", base.shared // MiB)) * MiB,
        (int(lo) * MiB, int(hi or lo) * MiB) if lo else base.distinct,
        int(os.environ.get("AENV_CATALOGUE_BUDGET_MIB", base.budget // MiB)) * MiB,
    )


def sizes(form: Form, seed: int) -> list[int]:
    """Each image's distinct layer size, spread over the range (4 KiB multiples)."""
    rng = random.Random(seed)
    lo, hi = form.distinct
    return [rng.randrange(lo, hi + 1) // 4096 * 4096 for _ in range(form.images)]


def payload(root: Path, inside: str, size: int, seed: str) -> str:
    """Files of `size` bytes in all under `root/inside`, each one 4 KiB block repeated
    (its own seed), and `SHA256SUMS` of them; the SHA256SUMS text."""
    where = root / inside.lstrip("/")
    where.mkdir(parents=True)
    lines, left, i = [], size, 0
    while left > 0:
        n = min(FILE, left)
        chunk = pattern_block(f"{seed}/{i}".encode()) * 256  # 1 MiB
        sha = hashlib.sha256()
        with (where / f"f{i:04d}").open("wb") as f:
            done = 0
            while done < n:
                piece = chunk[: n - done]
                f.write(piece)
                sha.update(piece)
                done += len(piece)
        lines.append(f"{sha.hexdigest()}  f{i:04d}\n")
        left, i = left - n, i + 1
    text = "".join(lines)
    (where / "SHA256SUMS").write_text(text)
    return text


@dataclass
class Sampler:
    """A node's disk use (`usage.scan` of its state dir and image cache, what its budget
    counts) at `hz`, and `du -sxB1` of both every `du_every` seconds as a cross-check;
    and the entries of the cache that vanished (evictions)."""

    state: Path
    cache: Path
    hz: float = 10
    du_every: float = 30
    peak: int = 0
    peak_mib: dict[str, int] = field(default_factory=dict)  # by category, at the peak
    samples: int = 0
    du_peak: int = 0
    du_runs: int = 0
    over: list[tuple[float, int]] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    gone: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    budget: int = 0
    #: at the first sample over the budget: its categories and `du -d 3` of both roots
    over_dump: str = ""
    #: the wall-clock time of that sample (the node's log lines are found by it)
    over_at: float = 0.0

    def __enter__(self) -> Sampler:
        for run in (self._scan, self._du):
            t = threading.Thread(target=run, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(120)

    def entries(self) -> set[str]:
        """The cache's and state's evictable entries by path (images, chains, blobs,
        layouts, captures and blob-cache files)."""
        out: set[str] = set()
        for top in (self.cache / "images", self.cache / "layers", self.cache / "oci"):
            out.update(str(p) for p in _children(top))
        out.update(str(p) for p in _children(self.cache / "blobs" / "sha256"))
        for top in _children(self.state):
            if top.is_dir():
                out.update(str(p) for p in _children(top))
        return out

    def _scan(self) -> None:
        t0 = time.monotonic()
        while not self._stop.is_set():
            tally = scan([(STATE, self.state), (IMAGES, self.cache)])
            total = tally.total
            self.samples += 1
            if total > self.peak:
                self.peak, self.peak_mib = (
                    total,
                    {k: round(v / MiB) for k, v in tally.bytes.items() if v},
                )
            if self.budget and total > self.budget:
                self.over.append((time.monotonic() - t0, total))
                if not self.over_dump:  # what was there, for the failure's message
                    self.over_at = time.time()
                    self.over_dump = _listing(tally.bytes, self.state, self.cache)
            if self.samples % int(self.hz) == 0:  # the entries once a second
                now = self.entries()
                self.gone |= self.seen - now
                self.seen = now
            self._stop.wait(1 / self.hz)

    def _du(self) -> None:
        while True:
            out = subprocess.run(
                ["du", "-sxcB1", str(self.state), str(self.cache)],
                capture_output=True,
                text=True,
            ).stdout.splitlines()
            if out and out[-1].endswith("total"):
                self.du_peak = max(self.du_peak, int(out[-1].split()[0]))
                self.du_runs += 1
            if self._stop.wait(self.du_every):
                return


def _listing(tally: dict[str, int], *roots: Path) -> str:
    """A sample's categories (MiB) and what lay where: a budget overrun is a moment (the
    full catalogue saw one of 0.5 s), so its cause is written down while it is there."""
    du = subprocess.run(
        ["du", "-xB1M", "-d", "3", *map(str, roots)], capture_output=True, text=True
    ).stdout
    mib = {k: round(v / (1 << 20)) for k, v in tally.items() if v}
    return f"categories (MiB): {mib}\n{du}"


def _children(d: Path) -> list[Path]:
    try:
        return list(d.iterdir())
    except OSError:
        return []


def ledger_near(log: str, at: float, before: float = 40.0, after: float = 2.0) -> str:
    """The node's lines of the `before` seconds up to `at` (and `after` it), QEMU's protocol
    chatter left out: what its disk ledger promised and charged (`disk reserved` / `disk
    charged` / `disk walk`) beside what it did, around a moment `du` saw over the budget."""
    out = []
    for line in log.splitlines():
        try:
            rec = json.loads(line)
            ts = datetime.fromisoformat(rec["ts"]).timestamp()
        except (ValueError, KeyError, TypeError):
            continue
        if at - before <= ts <= at + after and not str(rec.get("logger", "")).startswith("qemu"):
            out.append(f"{ts - at:+7.2f}s {rec.get('logger', '')}: {rec.get('msg', '')}")
    return "\n".join(out[-150:])
