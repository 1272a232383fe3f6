"""The node's volume images: one sparse file per volume under `<state>/volumes/<id>/`,
with a record of what it holds.

    image          the ext4, exactly `VOLUME_BYTES` long (sparse)
    record.json    {"version": key or null, "holder": id or null, "dirty": bool}

`version` is the repository key of the content the image holds while it is not `dirty`
(null: the empty file system made here). A holder (a sandbox, a content write) that has it
attached may write it: the record says so *before* the image is handed over, so a node
that dies with a VM on it knows, after its restart, that the image is no version any more
but what that holder left — to upload and release (the snapshot worker does, from the
log's kill of the sandbox), or to drop if the log gave the volume to someone else.

A volume released here keeps its image: the next attach of the same version on this node
uses it as it is (no download), which is why creates prefer the node that released last.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from workers.node.vmm import VOLUME_BYTES

__all__ = ["Record", "VolumeImages", "VolumeRepository", "version_key"]

log = logging.getLogger(__name__)

MKFS = "mkfs.ext4"
#: A 32 MiB journal (mke2fs would give a 64 GiB volume 512 MiB of journal: what the guest
#: writes there is data the next upload reads). Lazy init: nothing but a few MiB of
#: metadata is written, the rest of the file stays holes (reading as the zeros it needs).
MKFS_ARGS = (
    "-F",
    "-q",
    "-m",
    "0",
    "-J",
    "size=32",
    "-E",
    "lazy_itable_init=1,lazy_journal_init=1,nodiscard",
)


class VolumeRepository(Protocol):
    """What the images need of the snapshot repository (`SnapshotRepository`)."""

    async def upload_volume(self, image: Path, *, key: str, volume_id: str) -> object: ...

    async def download_volume(self, key: str, dest: Path) -> object: ...


@dataclass(frozen=True)
class Record:
    version: str | None = None
    holder: str | None = None
    dirty: bool = False


def version_key(volume_id: str, holder: str) -> str:
    """The repository key of the version `holder` leaves (a manifest id). One per holder:
    an upload redone after a crash overwrites its own manifest instead of leaving one."""
    return f"vol-{volume_id}-{holder}"


class VolumeImages:
    def __init__(self, root: Path, repository: VolumeRepository | None) -> None:
        self.root = root
        self.repository = repository
        self._locks: dict[str, asyncio.Lock] = {}
        root.mkdir(parents=True, exist_ok=True)

    def lock(self, volume_id: str) -> asyncio.Lock:
        """One operation on a volume's image at a time on this node."""
        return self._locks.setdefault(volume_id, asyncio.Lock())

    def image(self, volume_id: str) -> Path:
        return self.root / volume_id / "image"

    def scratch(self, volume_id: str) -> Path:
        return self.root / volume_id / "scratch"

    def record(self, volume_id: str) -> Record | None:
        try:
            doc = json.loads((self.root / volume_id / "record.json").read_text())
            return Record(**doc)
        except (OSError, ValueError, TypeError):
            return None

    def _write(self, volume_id: str, record: Record) -> None:
        d = self.root / volume_id
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / "record.json.tmp"
        tmp.write_text(json.dumps(asdict(record)))
        os.replace(tmp, d / "record.json")

    def held_by(self, holder: str) -> list[str]:
        """The volumes whose images `holder` has here."""
        out = []
        for d in sorted(self.root.iterdir()) if self.root.exists() else []:
            rec = self.record(d.name)
            if rec is not None and rec.holder == holder:
                out.append(d.name)
        return out

    def holders(self) -> dict[str, str]:
        """Volume → holder, of every image held here."""
        out = {}
        for d in sorted(self.root.iterdir()) if self.root.exists() else []:
            rec = self.record(d.name)
            if rec is not None and rec.holder is not None:
                out[d.name] = rec.holder
        return out

    async def prepare(self, volume_id: str, version: str | None, holder: str) -> Path:
        """The image `holder` may attach: the one it has already (a redelivered create),
        else this node's copy of `version` if it has it unchanged, else pulled from the
        repository (or, for a volume never written, a fresh file system). Recorded as held
        before it is returned. The caller holds `lock(volume_id)`."""
        rec = self.record(volume_id)
        image = self.image(volume_id)
        if rec is not None and rec.holder == holder and image.exists():
            return image
        if rec is not None and rec.holder is not None:
            log.warning(
                "volume %s: dropping the image %s left here (the log gave the volume to %s)",
                volume_id,
                rec.holder,
                holder,
            )
        await self.ensure(volume_id, version, clean_record=rec)
        self._write(volume_id, Record(version=version, holder=holder, dirty=True))
        return image

    async def ensure(
        self, volume_id: str, version: str | None, *, clean_record: Record | None = None
    ) -> Path:
        """This node's image holds `version` exactly (pulled or made if not); for a read
        of a volume nobody holds. The caller holds `lock(volume_id)`."""
        rec = clean_record if clean_record is not None else self.record(volume_id)
        image = self.image(volume_id)
        if (
            rec is not None
            and rec.holder is None
            and not rec.dirty
            and rec.version == version
            and image.exists()
        ):
            return image
        image.parent.mkdir(parents=True, exist_ok=True)
        self._write(volume_id, Record(version=None, holder=None, dirty=True))  # in the making
        if version is None:
            await _mkfs(image)
        else:
            if self.repository is None:
                raise OSError(
                    f"volume {volume_id}: version {version} is not on this node and "
                    "no snapshot repository is set"
                )
            await self.repository.download_volume(version, image)
        self._write(volume_id, Record(version=version))
        return image

    async def upload(self, volume_id: str, holder: str) -> tuple[str, int] | None:
        """The image as a new version in the repository: (its key, its stored size).
        None when there is no image here (a holder that ended before it was made)."""
        if not self.image(volume_id).exists():
            return None
        if self.repository is None:
            raise OSError("no snapshot repository: a volume cannot be made durable")
        key = version_key(volume_id, holder)
        result = await self.repository.upload_volume(
            self.image(volume_id), key=key, volume_id=volume_id
        )
        manifest = getattr(result, "manifest", None)
        image = getattr(manifest, "image", None)
        size = int(getattr(image, "stored_bytes", 0) or 0)
        return key, size

    def released(self, volume_id: str, version: str | None) -> None:
        """Its holder let it go: the image is `version` now (kept for the next attach)."""
        self._write(volume_id, Record(version=version))

    def forget_holder(self, volume_id: str) -> None:
        """The holder recorded here no longer has the volume (the log moved it on): the
        image is nobody's version; it goes."""
        self.drop(volume_id)

    def adopt(self, volume_id: str, holder: str, source: Path) -> Path:
        """An image pulled with a paused sandbox's capture (taken over from another node)
        becomes this node's image of the volume, held by that sandbox."""
        image = self.image(volume_id)
        image.parent.mkdir(parents=True, exist_ok=True)
        self._write(volume_id, Record(version=None, holder=holder, dirty=True))
        os.replace(source, image)
        return image

    def drop(self, volume_id: str) -> None:
        shutil.rmtree(self.root / volume_id, ignore_errors=True)


async def _mkfs(image: Path) -> None:
    """A fresh ext4 filling a sparse file of the slot size: a few MiB written, ~0.1 s."""
    tmp = image.with_name(image.name + ".new")
    await asyncio.to_thread(_sparse, tmp, VOLUME_BYTES)
    proc = await asyncio.create_subprocess_exec(
        MKFS,
        *MKFS_ARGS,
        str(tmp),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise OSError(f"mkfs.ext4 failed: {err.decode(errors='replace').strip()[:300]}")
    os.replace(tmp, image)


def _sparse(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size)
