"""The block service's cache cap as the node sets it while both run (issue 29).

The node holds the service's chunk cache in its disk budget (`workers/node/disk/chunkroom.py`)
and fits its cap to what the budget has free: at start, and again as the budget's room
changes. The service is a process of its own, so the cap travels as one file,
`<cache dir>/cap`, holding a byte count: written whole (a private name, then a rename), read
by the service at start and about once a second after. Newer than the service's
`--cache-bytes` by construction (the node writes it before it starts or adopts a service),
so when present it wins.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["FILE", "read_cap", "write_cap"]

FILE = "cap"


def write_cap(directory: Path, nbytes: int) -> None:
    path = directory / FILE
    tmp = path.with_name(f".{FILE}.tmp")
    tmp.write_text(f"{nbytes}\n")
    os.replace(tmp, path)


def read_cap(directory: Path) -> int | None:
    """The cap the node set, or None when it set none (a service run by hand, a test) or
    the file does not hold a byte count."""
    try:
        text = (directory / FILE).read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        nbytes = int(text.strip())
    except ValueError:
        return None
    return nbytes if nbytes >= 0 else None
