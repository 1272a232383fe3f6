"""The `images` read model, folded from image events with the domain's own `evolve`: each
recipe's published digest, or who builds it — for operators and for S11's janitor, which
forgets images no template or capture names."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Table
from sqlalchemy.ext.asyncio import AsyncConnection

from bus import AggregateKind, RecordedEvent
from domain import image as im
from domain.aggregates import IMAGE
from projections.folding import Row, fold_batch, upsert
from projections.tables import images

__all__ = ["ImageProjection", "image_from_row"]


def _row(i: im.Image, rec: RecordedEvent, _prior: Row | None) -> Row:
    claim, pub, fail = i.claim, i.published, i.last_failure
    return {
        "image_id": i.image_id,
        "status": i.status,
        "claim_node": claim.node_id if claim else None,
        "claim_since": claim.since if claim else None,
        "claim_until": claim.until if claim else None,
        "digest": pub.digest if pub else None,
        "stored_bytes": pub.stored_bytes if pub else None,
        "size": pub.size if pub else None,
        "role": pub.role if pub else None,
        "published_node": pub.node_id if pub else None,
        "published_at": pub.at if pub else None,
        "failure_node": fail.node_id if fail else None,
        "failure_reason": fail.reason if fail else None,
        "failed_at": fail.at if fail else None,
        "updated_at": rec.time,
    }


def image_from_row(r: Row) -> im.Image:
    """The state a row was written from (minus the write side's recent command ids)."""
    claim = pub = fail = None
    if r["claim_node"] is not None:
        claim = im.ImageClaim(
            node_id=r["claim_node"], since=r["claim_since"], until=r["claim_until"]
        )
    if r["digest"] is not None:
        pub = im.PublishedImage(
            digest=r["digest"],
            stored_bytes=r["stored_bytes"],
            size=r["size"],
            role=r["role"],
            node_id=r["published_node"],
            at=r["published_at"],
        )
    if r["failure_node"] is not None:
        fail = im.ImageFailure(
            node_id=r["failure_node"], reason=r["failure_reason"], at=r["failed_at"]
        )
    return im.Image(image_id=r["image_id"], claim=claim, published=pub, last_failure=fail)


class ImageProjection:
    """Recipes, one row each (a forgotten one stays, `empty`: it may be built again)."""

    name: str = "images"
    kind: AggregateKind = IMAGE.kind
    tables: tuple[Table, ...] = (images,)

    async def apply(self, conn: AsyncConnection, batch: Sequence[RecordedEvent]) -> None:
        rows = await fold_batch(
            conn,
            images,
            "image_id",
            batch,
            evolve=IMAGE.evolve,
            from_row=image_from_row,
            to_row=_row,
        )
        await upsert(conn, images, "image_id", rows)
