"""`aenv keys create|ls|revoke|limits`: API keys of the local stack.

An operator's commands, run where `aenv up` runs: they append to the event log (NATS) and read
the `api_keys` read model (Postgres) directly, so no API key is needed to manage keys. Each
write waits until the read model shows it, so a key minted here works at once and a key
revoked here is refused by the API within `api.auth.CACHE_S` seconds of the command returning.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from aenv.config import DEFAULT_DATA_DIR
from aenv.ops.stack import StackDir, operator_errors, running_stack
from aenv.output import Format, emit

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from bus import Bus

__all__ = ["keys_app"]

T = TypeVar("T")

#: How long a write waits for the `api_keys` projection to show it. The projector runs in
#: the stack's own process and applies a batch in milliseconds; seconds mean it is stuck.
PROJECTION_WAIT_S = 15.0

keys_app = typer.Typer(
    help="API keys of the local stack (run where `aenv up` runs).", no_args_is_help=True
)


@asynccontextmanager
async def _stack(info: dict[str, object]) -> AsyncIterator[tuple[Bus, AsyncEngine]]:
    from bus import Bus, BusSettings
    from projections import create_engine

    settings = BusSettings(nats_url=str(info["nats_url"]))
    bus = await Bus.connect(settings, setup=False, retry=False)
    engine = create_engine(str(info["database_url"]), pool_size=1)
    try:
        yield bus, engine
    finally:
        await engine.dispose()
        await bus.close()


def _run(data_dir: Path, what: str, body: Callable[[Bus, AsyncEngine], Awaitable[T]]) -> T:
    import asyncio  # here: `aenv --help` and the sandbox commands start without it

    info = running_stack(data_dir)

    async def run() -> T:
        async with _stack(info) as (bus, engine):
            return await body(bus, engine)

    with operator_errors(what):
        return asyncio.run(run())


async def _settled(bus: Bus, engine: AsyncEngine, key_id: str) -> None:
    """Return once the `api_keys` read model (what the API checks keys against) has folded
    the key's last event."""
    from projections import ApiKeyProjection, checkpoints

    seq = (await bus.api_keys.version(key_id)).seq
    await checkpoints.wait_for(engine, ApiKeyProjection.name, seq, timeout=PROJECTION_WAIT_S)


@keys_app.command("create")
def create(
    name: Annotated[str, typer.Option(help="A label shown by `aenv keys ls`.")] = "",
    team: Annotated[str, typer.Option(help="Team the key belongs to.")] = "default",
    data_dir: StackDir = DEFAULT_DATA_DIR,
) -> None:
    """Mint an API key and print it: once only, just its hash is stored.

    The key works as soon as this returns.
    """
    from api.admin import create_api_key

    async def body(bus: Bus, engine: AsyncEngine) -> str:
        key_id, raw = await create_api_key(bus, team_id=team, name=name)
        await _settled(bus, engine, key_id)
        return raw

    typer.echo(_run(data_dir, "keys create", body))


def _key_row(r: Any) -> dict[str, Any]:
    return {
        "key_id": r.key_id,
        "name": r.name,
        "team": r.team_id,
        "prefix": r.prefix,
        "created_at": r.created_at.isoformat(),
        "revoked_at": r.revoked_at.isoformat() if r.revoked_at else None,
        "limits": dict(r.limits or {}),
    }


def _human(row: dict[str, Any]) -> dict[str, Any]:
    def short(ts: str | None) -> str:
        return ts[:19].replace("T", " ") if ts else ""

    return {
        **row,
        "prefix": f"{row['prefix']}…",
        "created": short(row["created_at"]),
        "revoked": short(row["revoked_at"]) or "-",
        "limits": _limits_text(row["limits"]),
    }


def _limits_text(limits: dict[str, Any]) -> str:
    """`max=5 rate=2/s burst=4`, or `-` when the key sets none."""
    words = {"max_sandboxes": "max={}", "creates_per_s": "rate={:g}/s", "burst": "burst={}"}
    return " ".join(words[k].format(v) for k, v in limits.items() if k in words) or "-"


@keys_app.command("ls")
def ls(
    output: Annotated[
        Format,
        typer.Option("--output", "-o", help="table on a terminal, json when piped; or force one."),
    ] = Format.auto,
    team: Annotated[str | None, typer.Option(help="Only this team's keys.")] = None,
    data_dir: StackDir = DEFAULT_DATA_DIR,
) -> None:
    """List API keys, revoked ones included (never the keys themselves).

    Table: id, name, team, prefix, created, revoked, limits. JSON rows: key_id, name, team,
    prefix, created_at, revoked_at (null while the key is valid), limits (the key's own
    admission overrides: max_sandboxes, creates_per_s, burst; {} when it sets none).
    """
    from sqlalchemy import select

    from projections import tables

    t = tables.api_keys

    async def body(bus: Bus, engine: AsyncEngine) -> list[dict[str, Any]]:
        q = select(
            t.c.key_id,
            t.c.name,
            t.c.team_id,
            t.c.prefix,
            t.c.created_at,
            t.c.revoked_at,
            t.c.limits,
        ).order_by(t.c.created_at, t.c.key_id)
        if team is not None:
            q = q.where(t.c.team_id == team)
        async with engine.connect() as conn:
            return [_key_row(r) for r in (await conn.execute(q)).all()]

    rows = _run(data_dir, "keys ls", body)
    columns = ["key_id", "name", "team", "prefix", "created", "revoked", "limits"]
    emit(rows, columns, output, human=_human)


@keys_app.command("revoke")
def revoke(
    key_id: Annotated[
        str, typer.Argument(help="ID of the key (KEY_ID in `aenv keys ls`).", show_default=False)
    ],
    data_dir: StackDir = DEFAULT_DATA_DIR,
) -> None:
    """Revoke an API key: the API refuses it (401) within 5 s of this returning.

    The API caches a key lookup for at most api.auth.CACHE_S (5 s); this command returns
    once the key table shows the revocation. Revoking a revoked key is a no-op; an unknown
    KEY_ID exits 1.
    """
    from api.admin import revoke_api_key
    from api.auth import CACHE_S

    async def body(bus: Bus, engine: AsyncEngine) -> None:
        await revoke_api_key(bus, key_id)
        await _settled(bus, engine, key_id)

    _run(data_dir, f"keys revoke {key_id}", body)
    typer.echo(f"aenv: key {key_id} revoked; the API refuses it within {CACHE_S:g}s", err=True)


@keys_app.command("limits")
def limits(
    key_id: Annotated[
        str, typer.Argument(help="ID of the key (KEY_ID in `aenv keys ls`).", show_default=False)
    ],
    max_sandboxes: Annotated[
        int | None,
        typer.Option(
            "--max-sandboxes", min=0, help="Sandboxes its team may have running (0: no limit)."
        ),
    ] = None,
    creates_per_s: Annotated[
        float | None,
        typer.Option(
            "--creates-per-s", min=0, help="Sandboxes per second it may start (0: no limit)."
        ),
    ] = None,
    burst: Annotated[
        int | None,
        typer.Option("--burst", min=0, help="How many at once (0: one second's worth)."),
    ] = None,
    clear: Annotated[
        bool, typer.Option("--clear", help="Drop the key's overrides: its team's apply.")
    ] = False,
    data_dir: StackDir = DEFAULT_DATA_DIR,
) -> None:
    """Set a key's admission limits, over its team's and the defaults (docs/scale.md).

    Requests with this key are refused with 429 and Retry-After past them: its team's
    running sandboxes against --max-sandboxes; with --creates-per-s or --burst, the key's
    own token bucket instead of the team's. Options left out keep their value; --clear drops
    them all. In effect within 5 s (the API's key cache).
    """
    from sqlalchemy import select

    from api.admin import set_key_limits
    from domain.limits import Limits
    from projections import tables

    given = {
        k: v
        for k, v in (
            ("max_sandboxes", max_sandboxes),
            ("creates_per_s", creates_per_s),
            ("burst", burst),
        )
        if v is not None
    }
    if clear and given:
        from aenv.commands.common import EXIT_USAGE, die

        die("--clear takes no other limit", EXIT_USAGE)

    async def body(bus: Bus, engine: AsyncEngine) -> dict[str, Any]:
        state, _ = await bus.api_keys.load(key_id)
        now = state.limits if state is not None else Limits()
        new = Limits() if clear else now.model_copy(update=given)
        await set_key_limits(bus, key_id, Limits.model_validate(new.model_dump()))
        await _settled(bus, engine, key_id)
        t = tables.api_keys
        async with engine.connect() as conn:
            row = (await conn.execute(select(t.c.limits).where(t.c.key_id == key_id))).one()
        return dict(row.limits or {})

    now = _run(data_dir, f"keys limits {key_id}", body)
    typer.echo(f"aenv: key {key_id} limits: {_limits_text(now)}", err=True)
