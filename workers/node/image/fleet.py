"""`FleetImages`: a recipe is built once per fleet, and every other node fetches the bytes
that build produced (images-at-scale S5; builds are not byte-reproducible, §1).

The log decides who builds (`domain/image`: a claim with a lease), so two nodes never
debootstrap one recipe at once; the node's own `cache.locked` flock still keeps its threads
apart. What the bytes are and where they live is the `ImageShelf`'s business (the local
cache and the snapshot repository), so this module is only the protocol:

1. the shelf holds the recipe already → its digest;
2. the log says published → fetch those bytes;
3. else claim, build (the build uploads), publish; a failure is recorded and re-raised;
4. the claim refused → wait for the holder's `ImagePublished`/`ImageBuildFailed` or its
   lease to run out, then 2 or 3 again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from bus import MessageContext
from bus.decisions import execute
from bus.store import ImageStore
from domain import image as im

__all__ = ["BuiltImage", "FleetImages", "ImageShelf"]

log = logging.getLogger(__name__)

#: Renew the lease this often, as a share of its length: two renewals can be lost before
#: another node may take the build over.
_RENEW_SHARE = 1 / 3


@dataclass(frozen=True)
class BuiltImage:
    """A build this node made and uploaded: its content digest and sizes."""

    digest: str
    stored_bytes: int
    size: int


class ImageShelf(Protocol):
    """Where a node keeps images: its cache, filled from the repository."""

    def held(self, recipe: str) -> str | None:
        """The digest of this node's copy of `recipe`'s image, if it has one."""
        ...

    async def fetch(self, recipe: str, digest: str) -> None:
        """Download the published bytes `digest` and keep them as `recipe`'s image."""
        ...


class FleetImages:
    """One node's way to an image: its own copy, the fleet's, or the one build."""

    def __init__(
        self,
        store: ImageStore,
        shelf: ImageShelf,
        node_id: str,
        *,
        lease_s: int = im.DEFAULT_LEASE_S,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._store = store
        self._shelf = shelf
        self._node = node_id
        self._lease_s = lease_s
        self._clock = clock
        self._ctx = MessageContext(actor=f"node:{node_id}")
        #: background publishes of held copies (`ensure(share=...)`), kept referenced
        self._sharing: set[asyncio.Task[None]] = set()

    async def ensure(
        self,
        recipe: str,
        role: im.ImageRole,
        build: Callable[[], Awaitable[BuiltImage]],
        *,
        share: Callable[[], Awaitable[BuiltImage]] | None = None,
    ) -> str:
        """The digest of the image this node runs for `recipe`, fetched or built.

        `share` uploads the copy this node already holds: given, a held image the fleet
        has not published yet is published from here (in the background), so a fleet whose
        nodes built their images before S5 — or one node that built it with no repository
        — still gives the next node bytes to fetch instead of a build of its own."""
        if (held := self._shelf.held(recipe)) is not None:
            if share is not None:
                task = asyncio.create_task(self._share(recipe, role, share))
                self._sharing.add(task)
                task.add_done_callback(self._sharing.discard)
            return held
        iid = im.image_aggregate_id(recipe)
        while True:
            try:
                await self._claim(iid)
            except im.AlreadyPublished as done:
                await self._shelf.fetch(recipe, done.digest)
                return done.digest
            except im.ClaimHeld as held_by:
                log.info("image %s: %s builds it, waiting", iid, held_by.holder)
                await self._await_holder(iid)
                continue
            return await self._build(iid, recipe, role, build)

    async def _share(
        self, recipe: str, role: im.ImageRole, share: Callable[[], Awaitable[BuiltImage]]
    ) -> None:
        """Publish this node's copy unless the fleet has an image of `recipe` or another
        node is building one; best effort (a failure only means no sharing)."""
        iid = im.image_aggregate_id(recipe)
        try:
            state, _ = await self._store.load(iid)
            if state is not None and (
                state.published is not None or state.holder_at(self._clock()) is not None
            ):
                return
            await self._claim(iid)
            digest = await self._build(iid, recipe, role, share)
            log.info("image %s: shared this node's copy %s", iid, digest[:12])
        except (im.ClaimHeld, im.AlreadyPublished):
            return
        except Exception:
            log.warning("image %s: sharing this node's copy failed", iid, exc_info=True)

    async def _claim(self, iid: str) -> None:
        claim = im.ClaimImageBuild(
            image_id=iid, node_id=self._node, lease_s=self._lease_s, at=self._clock()
        )
        await execute(self._store, claim, self._ctx)

    async def _build(
        self,
        iid: str,
        recipe: str,
        role: im.ImageRole,
        build: Callable[[], Awaitable[BuiltImage]],
    ) -> str:
        renewing = asyncio.create_task(self._renew(iid))
        try:
            built = await build()
        except BaseException as e:  # cancelled too: the claim is freed at once
            renewing.cancel()
            reason = f"{type(e).__name__}: {e}"[:4000]
            fail = im.FailImageBuild(
                image_id=iid, node_id=self._node, reason=reason, at=self._clock()
            )
            with contextlib.suppress(Exception):  # the lease frees it anyway
                await asyncio.shield(execute(self._store, fail, self._ctx))
            raise
        finally:
            renewing.cancel()
        publish = im.PublishImage(
            image_id=iid,
            digest=built.digest,
            stored_bytes=built.stored_bytes,
            size=built.size,
            role=role,
            node_id=self._node,
            at=self._clock(),
        )
        try:
            await execute(self._store, publish, self._ctx)
        except im.AlreadyPublished as first:  # our lease ran out and another node won
            await self._shelf.fetch(recipe, first.digest)
            return first.digest
        return built.digest

    async def _renew(self, iid: str) -> None:
        """Claim again while the build runs, so a long build keeps its lease."""
        while True:
            await asyncio.sleep(self._lease_s * _RENEW_SHARE)
            try:
                await self._claim(iid)
            except (im.ClaimHeld, im.AlreadyPublished):
                return  # lost it: our publish still counts if nothing is published
            except Exception:
                log.warning("image %s: renewing the claim failed", iid, exc_info=True)

    async def _await_holder(self, iid: str) -> None:
        """Until the holder's build ends in the log, or its lease (renewed or not) runs
        out. The log is read again first: the build may have ended since the refusal."""
        state, version = await self._store.load(iid)
        live = state.holder_at(self._clock()) if state is not None else None
        if state is None or state.published is not None or live is None:
            return
        wait = (live.until - self._clock()).total_seconds()
        if wait <= 0:
            return
        ends = (im.ImagePublished, im.ImageBuildFailed, im.ImageForgotten)
        deadline = asyncio.get_running_loop().time() + wait
        async with self._store.watch(iid, version.seq) as feed:
            while (left := deadline - asyncio.get_running_loop().time()) > 0:
                if any(isinstance(r.event, ends) for r in await feed.next_batch(left)):
                    return
