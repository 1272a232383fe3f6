"""The template and API key read models, and the list of every projection."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Table
from sqlalchemy.ext.asyncio import AsyncConnection

from bus import AggregateKind, RecordedEvent
from domain import apikey as ak
from domain import template as tp
from domain.aggregates import APIKEY, TEMPLATE
from domain.limits import Limits
from projections.base import Projection
from projections.buildkeys import BuildKeyProjection
from projections.builds import BuildProjection
from projections.folding import Row, fold_batch, upsert
from projections.images import ImageProjection
from projections.leases import LeaseProjection
from projections.nodeorders import NodeCordonProjection
from projections.sandboxes import SandboxProjection
from projections.tables import api_keys, templates
from projections.volumes import VolumeProjection

__all__ = ["ApiKeyProjection", "TemplateProjection", "all_projections", "template_state"]


def _template_row(t: tp.Template, rec: RecordedEvent, prior: Row | None) -> Row:
    return {
        "template_id": t.template_id,
        "alias": t.alias,
        "envd_version": t.envd_version,
        "cpu_count": t.cpu_count,
        "memory_mb": t.memory_mb,
        "disk_size_mb": t.disk_size_mb,
        "deleted": t.deleted,
        "capture_key": t.capture_key,
        "capture_of": t.capture_of,
        "capture_bytes": t.capture_bytes,
        "image_bytes": t.image_bytes,
        "tags": {tag: b.model_dump(mode="json") for tag, b in t.tags.items()},
        "released": {c: since.isoformat() for c, since in t.released.items()},
        "created_at": prior["created_at"] if prior else rec.time,
        "updated_at": rec.time,
    }


_STATE_FIELDS = (
    "template_id",
    "alias",
    "envd_version",
    "cpu_count",
    "memory_mb",
    "disk_size_mb",
    "deleted",
    "capture_key",
    "capture_of",
    "capture_bytes",
    "image_bytes",
    "tags",
    "released",
)


def template_state(r: Row) -> tp.Template:
    """The aggregate state a `templates` row holds (the projection folds into it; the API
    resolves a create's `name:tag` with the domain's own rule on it)."""
    return tp.Template.model_validate({k: r[k] for k in _STATE_FIELDS if k in r})


class TemplateProjection:
    """Templates a sandbox may be created from (looked up by id or alias)."""

    name: str = "templates"
    kind: AggregateKind = TEMPLATE.kind
    tables: tuple[Table, ...] = (templates,)

    async def apply(self, conn: AsyncConnection, batch: Sequence[RecordedEvent]) -> None:
        rows = await fold_batch(
            conn,
            templates,
            "template_id",
            batch,
            evolve=TEMPLATE.evolve,
            from_row=template_state,
            to_row=_template_row,
        )
        await upsert(conn, templates, "template_id", rows)


def _key_row(k: ak.ApiKey, rec: RecordedEvent, prior: Row | None) -> Row:
    revoked_at = prior["revoked_at"] if prior else None
    if k.revoked and revoked_at is None:
        revoked_at = rec.time
    return {
        "key_id": k.key_id,
        "team_id": k.team_id,
        "name": k.name,
        "prefix": k.prefix,
        "key_sha256": k.key_sha256,
        "created_at": prior["created_at"] if prior else rec.time,
        "revoked_at": revoked_at,
        "limits": k.limits.model_dump(exclude_none=True),
    }


def _key_from_row(r: Row) -> ak.ApiKey:
    return ak.ApiKey(
        key_id=r["key_id"],
        team_id=r["team_id"],
        name=r["name"],
        prefix=r["prefix"],
        key_sha256=r["key_sha256"],
        revoked=r["revoked_at"] is not None,
        limits=Limits.model_validate(r["limits"] or {}),
    )


class ApiKeyProjection:
    """API keys, hashed: the API authenticates by sha256 of the presented key."""

    name: str = "api_keys"
    kind: AggregateKind = APIKEY.kind
    tables: tuple[Table, ...] = (api_keys,)

    async def apply(self, conn: AsyncConnection, batch: Sequence[RecordedEvent]) -> None:
        rows = await fold_batch(
            conn,
            api_keys,
            "key_id",
            batch,
            evolve=APIKEY.evolve,
            from_row=_key_from_row,
            to_row=_key_row,
        )
        await upsert(conn, api_keys, "key_id", rows)


def all_projections() -> list[Projection]:
    """Every read model the API needs, in the order a rebuild runs them."""
    return [
        SandboxProjection(),
        TemplateProjection(),
        ApiKeyProjection(),
        BuildProjection(),
        VolumeProjection(),
        ImageProjection(),
        BuildKeyProjection(),
        NodeCordonProjection(),
        LeaseProjection(),
    ]
