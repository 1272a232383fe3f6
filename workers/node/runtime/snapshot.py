"""A captured VM on local disk: device state + RAM file + frozen disk chain + a manifest.

The manifest records the machine it came from, so a restore on a different QEMU or machine
shape is refused up front rather than left to hang inside an incoming migration.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from workers.node.image.cache import cache_root, content_dir
from workers.node.image.content import recipe_of
from workers.node.image.runtime import find_runtime
from workers.node.vmm.spec import Machine

MANIFEST = "manifest.json"
#: present once a VM that adopted the capture's RAM file ran without a copy of it kept:
#: its memory moved on past the device state beside it, so the capture no longer restores.
#: Written by older nodes only (a resume without the copy now fails, `ramfile.keep_capture`);
#: still read, for captures they left
SPENT = "spent"
FORMAT_VERSION = 2  # 2: the runtime disk


@dataclass(frozen=True)
class Snapshot:
    snapshot_id: str
    dir: Path
    machine: Machine
    disk_top: Path  # frozen qcow2 layer; its backing chain ends at the template's base image
    base_image: Path
    #: envd's runtime disk the captured VM ran with: a restore attaches the same one
    runtime_disk: Path
    parent_vm: str | None = None
    created_at: str = ""
    state_bytes: int = 0
    #: the state stream carries the guest RAM (saved from a private-RAM VM: a fork child);
    #: the `mem` file is then only a sparse placeholder of the right size
    ram_in_state: bool = False
    #: how long the captured VM stood still for it (vCPUs stopped until resumed or gone)
    stopped_ms: float = 0.0
    #: a filesystem-only capture: the disk, no memory (its `state` and `mem` are empty);
    #: it restores by booting the disk again, and `guest_defaults` is what that boot's
    #: /init tells envd (the template's ENV, USER, WORKDIR, as the guest had them)
    disk_only: bool = False
    guest_defaults: dict[str, object] = field(default_factory=dict)
    #: the content digests (`shared/diskdigest.py`) of the base image and runtime disk the
    #: VM ran over: its layers are writes to those bytes, so a node that stacks them on
    #: other bytes corrupts the guest's filesystem. None: a capture taken before digests
    #: were recorded, which never leaves its node (`workers/snapshot/samebytes.py`)
    base_content: str | None = None
    runtime_content: str | None = None

    @property
    def state(self) -> Path:
        return self.dir / "state"

    @property
    def mem(self) -> Path:
        return self.dir / "mem"

    @property
    def spent(self) -> bool:
        return (self.dir / SPENT).exists()

    def write(self) -> None:
        doc = {
            "format": FORMAT_VERSION,
            "snapshot_id": self.snapshot_id,
            "machine": asdict(self.machine),
            "fingerprint": self.machine.fingerprint(),
            "disk_top": str(self.disk_top),
            "base_image": str(self.base_image),
            "runtime_disk": str(self.runtime_disk),
            # on another node (a capture pulled from the repository) the path may differ:
            # the runtime of the same digest is looked up in that node's image cache
            "runtime_digest": recipe_of(self.runtime_disk),
            "parent_vm": self.parent_vm,
            "created_at": self.created_at or datetime.now(UTC).isoformat(),
            "state_bytes": self.state_bytes,
            "ram_in_state": self.ram_in_state,
            "stopped_ms": self.stopped_ms,
            "disk_only": self.disk_only,
            "guest_defaults": self.guest_defaults,
            "base_content": self.base_content,
            "runtime_content": self.runtime_content,
        }
        tmp = self.dir / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(doc, indent=2))
        tmp.replace(self.dir / MANIFEST)  # a manifest exists only for a complete snapshot

    @classmethod
    def read(cls, directory: Path) -> Snapshot:
        doc = json.loads((directory / MANIFEST).read_text())
        if doc.get("format") != FORMAT_VERSION:
            raise ValueError(f"{directory}: unknown snapshot format {doc.get('format')!r}")
        m = doc["machine"]
        m["devices"] = tuple(m["devices"])
        return cls(
            snapshot_id=doc["snapshot_id"],
            dir=directory,
            machine=Machine(**m),
            disk_top=Path(doc["disk_top"]),
            base_image=Path(doc["base_image"]),
            runtime_disk=_runtime_disk(doc),
            parent_vm=doc.get("parent_vm"),
            created_at=doc.get("created_at", ""),
            state_bytes=int(doc.get("state_bytes", 0)),
            ram_in_state=bool(doc.get("ram_in_state", False)),
            stopped_ms=float(doc.get("stopped_ms", 0.0)),
            disk_only=bool(doc.get("disk_only", False)),
            guest_defaults=dict(doc.get("guest_defaults") or {}),
            base_content=doc.get("base_content"),
            runtime_content=doc.get("runtime_content"),
        )


def _runtime_disk(doc: dict[str, object]) -> Path:
    """The runtime a capture names: its path if this node has it, else this node's copy of
    the same digest (a capture taken on another node)."""
    path = Path(str(doc["runtime_disk"]))
    if path.is_file() or not doc.get("runtime_digest"):
        return path
    if doc.get("runtime_content") and (
        same := content_dir(cache_root(), str(doc["runtime_content"]))
    ):
        return same / path.name  # the very bytes, whatever recipe built them here
    return find_runtime(str(doc["runtime_digest"])).path
