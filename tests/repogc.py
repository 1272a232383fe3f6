"""A fleet's snapshot repository as a test reads it, straight from its S3 store and apart
from the repository GC it checks: every manifest, every blob, and the blobs no manifest
names (what the GC must leave none of); and what a node's log says its GC deleted."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

from workers.snapshot import ManifestNotFound, S3Config, S3Store
from workers.snapshot.leftovers import named_images
from workers.snapshot.manifest import SnapshotManifest, parse_manifest
from workers.snapshot.paths import image_key

__all__ = ["Holdings", "gc_lines", "holdings", "images_under"]

MiB = 1 << 20


@dataclass(frozen=True)
class Holdings:
    """One reading of the store: manifest id → the blobs it names; blob → its size."""

    manifests: dict[str, frozenset[str]]
    blobs: dict[str, int]

    @property
    def orphans(self) -> dict[str, int]:
        """Blobs no manifest names, with their sizes."""
        named = set().union(*self.manifests.values()) if self.manifests else set()
        return {d: n for d, n in self.blobs.items() if d not in named}

    def describe(self) -> str:
        orphans = self.orphans
        return (
            f"{len(self.manifests)} manifests, {len(self.blobs)} blobs "
            f"({sum(self.blobs.values()) / MiB:.0f} MiB), {len(orphans)} named by none "
            f"({sum(orphans.values()) / MiB:.0f} MiB)"
        )


def _config(env: Mapping[str, str]) -> S3Config:
    """The store a fleet's role with environment `env` writes to."""
    return S3Config(
        bucket=env.get("AENV_S3_BUCKET", "aenv-snapshots"),
        endpoint_url=env["AENV_S3_ENDPOINT"],
        access_key=env["AENV_S3_ACCESS_KEY"],
        secret_key=env["AENV_S3_SECRET_KEY"],
        create_bucket=False,
    )


async def _read(env: Mapping[str, str]) -> Holdings:
    store = await S3Store.open(_config(env))
    try:
        manifests: dict[str, frozenset[str]] = {}
        for mid in await store.list_manifests():
            try:
                doc = parse_manifest(await store.get_manifest(mid))
            except ManifestNotFound:  # deleted while listed: names nothing any more
                continue
            manifests[mid] = frozenset(doc.blob_digests())
        # the blobs after the manifests: a blob written after the listing is a new
        # upload's (then named by a manifest to come), one deleted meanwhile is not listed
        blobs = {b.digest: b.size async for b in store.iter_blobs()}
        return Holdings(manifests, blobs)
    finally:
        await store.close()


def holdings(env: Mapping[str, str]) -> Holdings:
    """The store's manifests and blobs now (`env`: a fleet role's, for its S3 settings)."""
    return asyncio.run(_read(env))


async def _images(env: Mapping[str, str], keys: list[str]) -> dict[str, set[str]]:
    store = await S3Store.open(_config(env))
    try:
        out: dict[str, set[str]] = {}
        for key in keys:
            doc = parse_manifest(await store.get_manifest(key))
            assert isinstance(doc, SnapshotManifest), (key, type(doc))
            out[key] = {image_key(d) for d in named_images([doc])}
        return out
    finally:
        await store.close()


def images_under(env: Mapping[str, str], capture_keys: list[str]) -> dict[str, set[str]]:
    """The image manifests (`image-<digest>`) each capture is taken over: its base image and
    its runtime disk."""
    return asyncio.run(_images(env, capture_keys))


def gc_lines(log: str) -> list[str]:
    """The lines of a node's log that say what its repository GC did (`gcrun.py`: each
    round's blobs deleted, each image forgotten)."""
    return [
        ln
        for ln in log.splitlines()
        if "repository gc" in ln or "forgotten: no capture names it" in ln
    ]
