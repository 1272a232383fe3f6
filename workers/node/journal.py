"""The node's own record of the sandboxes it hosts, on local disk.

VMs die with the node process (they are tied to it so none can outlive it unnoticed), so
after a restart the node must tell the log which of its sandboxes are gone. This journal is
how it knows which ones were its own without reading anyone else's read model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


class Journal:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def add(self, sandbox_id: str, template_id: str) -> None:
        tmp = self.root / f".{sandbox_id}.tmp"
        tmp.write_text(json.dumps({"sandbox_id": sandbox_id, "template_id": template_id}))
        os.replace(tmp, self.root / f"{sandbox_id}.json")

    def remove(self, sandbox_id: str) -> None:
        (self.root / f"{sandbox_id}.json").unlink(missing_ok=True)

    def entries(self) -> list[str]:
        return sorted(p.stem for p in self.root.glob("*.json"))
