"""aenv's read side: Postgres read models folded from the event stream (design §5).

Imports the domain and `bus`, never `api/` or `workers/`. Public API::

    DbSettings, create_engine, migrate(url)            — connection and schema (Alembic)
    Projector(engine, js, bus_settings, projection)    — .start/.stop/.catch_up/.wait_for
    all_projections(), SandboxProjection, TemplateProjection, ApiKeyProjection
    checkpoints.wait_for(engine, name, seq)            — read-your-writes from any process
    rebuild(engine, js, bus_settings, projection)      — refold from 0, compare, swap
    history(store, id) / history_line(rec) / format_line — `aenv events [<id>] [--follow]`
    queries: get_sandbox, list_sandboxes (E2B paging), list_snapshots,
             template_by_id_or_alias, released_captures, api_key_by_hash
    console: the web console's reads (every state, counts, fork families, builds)
    template_state(row)                                — a templates row as the aggregate
    tables: sandboxes, snapshots, templates, api_keys, nodes (view), projection_checkpoints
"""

from projections import checkpoints, console, queries, tables
from projections.base import Projection
from projections.catalog import (
    ApiKeyProjection,
    TemplateProjection,
    all_projections,
    template_state,
)
from projections.db import DbSettings, alembic_config, create_engine, migrate
from projections.errors import ProjectionError, ProjectionTimeout, RebuildError
from projections.history import (
    HistoryLine,
    format_history,
    format_line,
    history,
    history_header,
    history_line,
)
from projections.rebuild import RebuildReport, rebuild, table_rows
from projections.runner import Projector
from projections.sandboxes import SandboxProjection, sandbox_from_row, sandbox_row

__all__ = [
    "ApiKeyProjection",
    "DbSettings",
    "HistoryLine",
    "Projection",
    "ProjectionError",
    "ProjectionTimeout",
    "Projector",
    "RebuildError",
    "RebuildReport",
    "SandboxProjection",
    "TemplateProjection",
    "alembic_config",
    "all_projections",
    "checkpoints",
    "console",
    "create_engine",
    "format_history",
    "format_line",
    "history",
    "history_header",
    "history_line",
    "migrate",
    "queries",
    "rebuild",
    "sandbox_from_row",
    "sandbox_row",
    "table_rows",
    "tables",
    "template_state",
]
