"""The node's own record of the sandboxes it hosts, on local disk.

VMs die with the node process (they are tied to it so none can outlive it unnoticed), so
after a restart the node must tell the log which of its sandboxes are gone — and which are
merely paused, their captures still on this disk and resumable. This journal is how it
knows which ones were its own without reading anyone else's read model.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Entry:
    sandbox_id: str
    template_id: str
    paused_snapshot: str | None = None
    #: the capture a resume ran from, kept whole until the log holds the resume and the
    #: node released it (`settle`): a node killed in between rolls the sandbox back to it
    resumed_from: str | None = None


class Journal:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def add(
        self,
        sandbox_id: str,
        template_id: str,
        paused_snapshot: str | None = None,
        *,
        resumed_from: str | None = None,
    ) -> None:
        tmp = self.root / f".{sandbox_id}.tmp"
        doc = {
            "sandbox_id": sandbox_id,
            "template_id": template_id,
            "paused_snapshot": paused_snapshot,
        }
        if resumed_from is not None:
            doc["resumed_from"] = resumed_from
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.root / f"{sandbox_id}.json")

    def settle(self, sandbox_id: str) -> None:
        """The resume of a running sandbox is recorded: its entry no longer names the
        capture it ran from (which goes next)."""
        try:
            entry = Entry(**json.loads((self.root / f"{sandbox_id}.json").read_text()))
        except (OSError, ValueError, TypeError):
            return  # not hosted here (killed meanwhile), or a torn write `entries` drops
        if entry.resumed_from is not None:
            self.add(sandbox_id, entry.template_id, entry.paused_snapshot)

    def remove(self, sandbox_id: str) -> None:
        (self.root / f"{sandbox_id}.json").unlink(missing_ok=True)

    def entries(self) -> list[Entry]:
        out = []
        for p in sorted(self.root.glob("*.json")):
            try:
                out.append(Entry(**json.loads(p.read_text())))
            except (ValueError, TypeError):
                p.unlink(missing_ok=True)  # a torn write of a sandbox that never started
        return out
