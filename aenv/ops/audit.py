"""`aenv audit`: replay the sandbox log and say whether every accepted command ended once.

For an RL run this is the receipt: after a crash, a redeploy or a long campaign, the log
itself shows that no rollout's create, pause, resume, fork or kill was lost or done twice
and that no sandbox is stuck half-way (`projections.audit`). Requests still in flight on a
live stack show as unanswered until they finish: run it again on a quiet stack.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

from aenv.commands.common import EXIT_FAILED
from aenv.config import DEFAULT_DATA_DIR
from aenv.ops.stack import StackDir, operator_errors, running_stack
from aenv.output import Format, wants_json

if TYPE_CHECKING:
    from projections.audit import AuditReport

__all__ = ["audit"]


def audit(
    output: Annotated[
        Format,
        typer.Option("--output", "-o", help="table on a terminal, json when piped; or force one."),
    ] = Format.auto,
    data_dir: StackDir = DEFAULT_DATA_DIR,
) -> None:
    """Replay the sandbox event log: every accepted request answered exactly once (or
    overtaken by its sandbox's kill), none twice, no sandbox stuck in a transitional state.
    Exits 1 with the findings otherwise. Reads the stack's NATS directly."""
    import asyncio

    from bus import Bus, BusSettings

    info = running_stack(data_dir)

    async def run() -> AuditReport:
        from projections.audit import audit as audit_log
        from projections.audit import read_log

        settings = BusSettings(nats_url=str(info["nats_url"]))
        bus = await Bus.connect(settings, setup=False, retry=False)
        try:
            return audit_log(await read_log(bus.js, settings))
        finally:
            await bus.close()

    with operator_errors("audit"):
        report = asyncio.run(run())
    if wants_json(output):
        doc = {
            "sandboxes": report.sandboxes,
            "events": report.events,
            "requests": dict(report.requests),
            "answered": report.answered,
            "overtaken": report.overtaken,
            "unanswered": report.unanswered,
            "duplicated": report.duplicated,
            "stuck": report.stuck,
            "statuses": dict(report.statuses),
            "findings": [f.__dict__ for f in report.findings],
        }
        typer.echo(json.dumps(doc))
    else:
        typer.echo(report.summary())
        for f in report.findings:
            typer.echo(f"{f.sandbox_id}\t{f.what}\t{f.detail}")
    if not report.clean:
        raise typer.Exit(EXIT_FAILED)
