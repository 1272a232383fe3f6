"""The node's snapshot directory as the repository reads and writes it.

The layout is the node's (`workers/node/runtime/snapshot.py`): `state`, `mem`,
`manifest.json` and, for a downloaded snapshot, `layers/`. `manifest.json` is written last:
its presence is what says the directory is complete.
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from workers.snapshot.errors import LayoutError

__all__ = [
    "LAYERS",
    "MEM",
    "NODE_MANIFEST",
    "STATE",
    "copy_file",
    "parse_time",
    "read_node_manifest",
    "write_atomic",
]

NODE_MANIFEST = "manifest.json"  # the node's snapshot directory layout (runtime/snapshot.py)
STATE, MEM, LAYERS = "state", "mem", "layers"


def read_node_manifest(snapshot_dir: Path) -> dict[str, Any]:
    try:
        doc = json.loads((snapshot_dir / NODE_MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise LayoutError(f"{snapshot_dir}: no readable {NODE_MANIFEST}: {e}") from e
    if not isinstance(doc, dict) or "snapshot_id" not in doc:
        raise LayoutError(f"{snapshot_dir}/{NODE_MANIFEST} is not a node snapshot manifest")
    return doc


def parse_time(value: object) -> datetime:
    """The node manifest's `created_at`; now when it has none (or an unreadable one)."""
    if isinstance(value, str) and value:
        try:
            t = datetime.fromisoformat(value)
            return t if t.tzinfo else t.replace(tzinfo=UTC)
        except ValueError:
            pass
    return datetime.now(UTC)


def copy_file(src: Path, dest: Path) -> None:
    tmp = dest.with_name(dest.name + ".part")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dest)


def write_atomic(dest: Path, text: str) -> None:
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, dest)
