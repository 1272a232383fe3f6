"""The `sandboxes` and `snapshots` read models, folded from sandbox events, and the creates
counted per template (`template_spawns`)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Table
from sqlalchemy.ext.asyncio import AsyncConnection

from bus import AggregateKind, RecordedEvent
from domain import sandbox as sb
from domain import tags as tg
from domain.aggregates import SANDBOX
from projections.folding import Row, fold_batch, load_rows, upsert
from projections.tables import sandboxes, snapshots, template_spawns

__all__ = ["SandboxProjection", "sandbox_from_row", "sandbox_row"]


def sandbox_row(s: sb.Sandbox, rec: RecordedEvent, _prior: Row | None = None) -> Row:
    """The `sandboxes` row of a state (what the E2B API's Sandbox/SandboxDetail/ListedSandbox
    need, plus what rebuilding the state requires)."""
    return {
        "sandbox_id": s.sandbox_id,
        "status": s.status.value,
        "state": sb.public_state(s.status),
        "template_id": s.template_id,
        "alias": s.alias,
        "team_id": s.team_id,
        "api_key_id": s.api_key_id,
        "node_id": s.node_id,
        "forked_from": s.forked_from,
        "cpu_count": s.cpu_count,
        "memory_mb": s.memory_mb,
        "disk_size_mb": s.disk_size_mb,
        "envd_version": s.envd_version,
        "envd_access_token": s.envd_access_token,
        "traffic_access_token": s.traffic_access_token,
        "metadata": s.metadata,
        "env_vars": s.env_vars,
        "on_timeout": s.lifecycle.on_timeout,
        "auto_resume": s.lifecycle.auto_resume,
        "pause_memory": s.lifecycle.pause_memory,
        "allow_internet_access": s.network.allow_internet_access,
        "network": s.network.model_dump(mode="json"),
        "timeout_s": s.timeout_s,
        "requested_at": s.requested_at,
        "started_at": s.started_at,
        "end_at": s.end_at,
        "remaining_s": s.remaining_s,
        "paused_at": s.paused_at,
        "disk_full_at": s.disk_full_at,
        "failure_reason": s.failure_reason,
        "pending_children": list(s.pending_children),
        "pending_snapshot_id": s.pending_snapshot_id,
        "volume_mounts": [m.model_dump(mode="json") for m in s.volume_mounts],
        "updated_at": rec.time,
    }


def sandbox_from_row(r: Row) -> sb.Sandbox:
    """The state a row was written from (minus the write side's recent command ids).

    Built without validation: the row was written from a validated state by `sandbox_row`.
    """
    return sb.Sandbox.model_construct(
        sandbox_id=r["sandbox_id"],
        status=sb.SandboxStatus(r["status"]),
        template_id=r["template_id"],
        alias=r["alias"],
        team_id=r["team_id"],
        api_key_id=r["api_key_id"],
        cpu_count=r["cpu_count"],
        memory_mb=r["memory_mb"],
        disk_size_mb=r["disk_size_mb"],
        envd_version=r["envd_version"],
        envd_access_token=r["envd_access_token"],
        traffic_access_token=r["traffic_access_token"],
        metadata=r["metadata"],
        env_vars=r["env_vars"],
        lifecycle=sb.Lifecycle.model_construct(
            on_timeout=r["on_timeout"],
            auto_resume=r["auto_resume"],
            pause_memory=r["pause_memory"],
        ),
        network=sb.NetworkPolicy.model_validate(r["network"]),
        forked_from=r["forked_from"],
        node_id=r["node_id"],
        requested_at=r["requested_at"],
        timeout_s=r["timeout_s"],
        started_at=r["started_at"],
        end_at=r["end_at"],
        remaining_s=r["remaining_s"],
        paused_at=r["paused_at"],
        disk_full_at=r["disk_full_at"],
        failure_reason=r["failure_reason"],
        pending_children=tuple(r["pending_children"]),
        pending_snapshot_id=r["pending_snapshot_id"],
        volume_mounts=tuple(sb.VolumeMount.model_validate(m) for m in r["volume_mounts"]),
        recent_commands=(),
    )


class SandboxProjection:
    """Sandboxes (one row each, E2B's listing and detail), their named snapshots, and the
    creates of each template (E2B's `spawnCount`)."""

    name: str = "sandboxes"
    kind: AggregateKind = SANDBOX.kind
    tables: tuple[Table, ...] = (sandboxes, snapshots, template_spawns)

    async def apply(self, conn: AsyncConnection, batch: Sequence[RecordedEvent]) -> None:
        rows = await fold_batch(
            conn,
            sandboxes,
            "sandbox_id",
            batch,
            evolve=SANDBOX.evolve,
            from_row=sandbox_from_row,
            to_row=sandbox_row,
        )
        await upsert(conn, sandboxes, "sandbox_id", rows)
        await upsert(
            conn,
            snapshots,
            "snapshot_id",
            await self._snapshots(conn, batch, rows),
            guard="last_seq",
        )
        await upsert(
            conn,
            template_spawns,
            "template_id",
            await _spawns(conn, batch, rows),
            guard="last_seq",
        )

    async def _snapshots(
        self, conn: AsyncConnection, batch: Sequence[RecordedEvent], sbx: dict[str, Row]
    ) -> dict[str, Row]:
        events = [
            r
            for r in batch
            if isinstance(r.event, sb.SnapshotRequested | sb.SnapshotTaken | sb.SnapshotFailed)
        ]
        if not events:
            return {}
        ids = {getattr(r.event, "snapshot_id") for r in events}  # noqa: B009
        rows = await load_rows(conn, snapshots, "snapshot_id", ids)
        changed: dict[str, Row] = {}
        for rec in events:
            e = rec.event
            match e:
                case sb.SnapshotRequested():
                    owner = sbx.get(e.sandbox_id)
                    row: Row = {
                        "snapshot_id": e.snapshot_id,
                        "sandbox_id": e.sandbox_id,
                        "team_id": owner["team_id"] if owner else None,
                        "template_id": owner["template_id"] if owner else "",
                        "status": "requested",
                        "size_bytes": None,
                        "failure_reason": None,
                        "node_id": None,
                        "requested_at": e.at,
                        "taken_at": None,
                    }
                case sb.SnapshotTaken():
                    row = {
                        **rows[e.snapshot_id],
                        "status": "ready",
                        "size_bytes": e.size_bytes,
                        "node_id": e.node_id,
                        "taken_at": e.at,
                    }
                case sb.SnapshotFailed():
                    row = {**rows[e.snapshot_id], "status": "failed", "failure_reason": e.reason}
                case _:
                    continue
            if int(rows.get(e.snapshot_id, {}).get("last_seq", 0)) >= rec.seq:
                continue
            row |= {"revision": rec.envelope.aggregate_version, "last_seq": rec.seq}
            rows[e.snapshot_id] = changed[e.snapshot_id] = row
        return changed


async def _spawns(
    conn: AsyncConnection, batch: Sequence[RecordedEvent], sbx: dict[str, Row]
) -> dict[str, Row]:
    """Each template's count moved by the batch's `SandboxCreated` (once per sandbox: a
    resume is `SandboxResumed`). A sandbox the batch did not change had all its events
    folded already, its create counted with them; a template's `last_seq` skips a create
    replayed after that (the count and the checkpoint commit together)."""
    created = [
        (tg.shown_template(sbx[r.envelope.aggregate_id]["template_id"]), r)
        for r in batch
        if isinstance(r.event, sb.SandboxCreated) and r.envelope.aggregate_id in sbx
    ]
    if not created:
        return {}
    rows = await load_rows(conn, template_spawns, "template_id", {t for t, _ in created})
    changed: dict[str, Row] = {}
    for tid, rec in created:
        row = rows.get(tid) or {"template_id": tid, "spawn_count": 0, "last_seq": 0}
        if int(row["last_seq"]) >= rec.seq:
            continue
        rows[tid] = changed[tid] = row | {
            "spawn_count": int(row["spawn_count"]) + 1,
            "last_spawned_at": rec.event.at,
            "last_seq": rec.seq,
        }
    return changed
