"""`aenv events [ID] [--follow]`: sandbox history straight from the event log (NATS), the
source of truth, on the machine that runs the stack.

Without `--follow`: one sandbox's whole history, then its fork lineage as a tree. With it:
events as they are appended — every sandbox's from now on, or one sandbox's from its first
event — until Ctrl-C, which exits 0.
"""

from __future__ import annotations

import json
import signal
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from aenv.commands.common import EXIT_FAILED, EXIT_SERVER, EXIT_USAGE, die
from aenv.config import DEFAULT_DATA_DIR
from aenv.ops.lineage import Family, LineageNode, render, walk
from aenv.ops.stack import StackDir, operator_errors, running_stack
from aenv.output import Format, wants_json

if TYPE_CHECKING:
    from bus import Bus
    from bus.store import SandboxStore
    from projections import HistoryLine

__all__ = ["events"]

#: How often the follow loop looks up from an idle feed to notice Ctrl-C.
_IDLE_POLL_S = 0.25


class _Printer:
    """Writes lines as they come (flushed, so a pipe sees each at once); a closed pipe
    (`| head`) ends the command quietly, as it would for any Unix filter."""

    def __init__(self, as_json: bool, with_id: bool) -> None:
        self.as_json, self.with_id, self.closed = as_json, with_id, False

    def header(self) -> None:
        from projections import history_header

        if not self.as_json:
            self.write(history_header(self.with_id))

    def line(self, ln: HistoryLine) -> None:
        from projections import format_line

        text = json.dumps(ln.as_json()) if self.as_json else format_line(ln, self.with_id)
        self.write(text)

    def write(self, text: str) -> None:
        if self.closed:
            return
        try:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()
        except BrokenPipeError:
            self.closed = True
            # later flushes (at exit too) would raise again: point stdout at nothing
            sys.stdout = open("/dev/null", "w")  # noqa: SIM115


async def _lineage_node(store: SandboxStore, sandbox_id: str) -> LineageNode | None:
    from domain import sandbox as sb

    recs = await store.read(sandbox_id)
    if not recs:
        return None
    state = sb.fold(r.event for r in recs)
    children: list[str] = []
    errors: dict[str, str] = {}
    for r in recs:
        if isinstance(r.event, sb.SandboxForked):
            for c in r.event.children:
                children.append(c.sandbox_id)
                if c.error is not None:
                    errors[c.sandbox_id] = c.error
    return LineageNode(
        sandbox_id,
        state.status.value if state is not None else "unknown",
        state.forked_from if state is not None else None,
        tuple(children),
        errors,
    )


async def _history(bus: Bus, sandbox_id: str, printer: _Printer) -> Family | None:
    from projections import history

    lease = sandbox_id.startswith("lease-")  # a lease's id (`api/leases.py`), never a sandbox's
    lines = await history(bus.leases if lease else bus.sandboxes, sandbox_id)
    if not lines:
        die(f"no events for {'lease' if lease else 'sandbox'} {sandbox_id}", EXIT_FAILED)
    printer.header()
    for ln in lines:
        printer.line(ln)
    if printer.as_json or lease:
        return None
    store = bus.sandboxes
    return await walk(sandbox_id, lambda sid: _lineage_node(store, sid))


async def _follow(bus: Bus, sandbox_id: str | None, printer: _Printer) -> None:
    """Print events as they are appended until SIGINT/SIGTERM (or the reader goes away)."""
    import asyncio

    from bus import AggregateKind, EventFeed, stream_last_seq
    from projections import history_line

    if sandbox_id is not None:
        if (await bus.sandboxes.version(sandbox_id)).seq == 0:
            die(f"no events for sandbox {sandbox_id}", EXIT_FAILED)
        subject, start = bus.names.sandbox_events(sandbox_id), 1  # its past, then live
    else:
        subject = bus.names.events_of_kind(AggregateKind.SANDBOX)
        start = await stream_last_seq(bus.js, bus.settings) + 1  # from now on
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    printer.header()
    async with EventFeed(bus.js, bus.settings, subject, start_seq=start) as feed:
        while not stop.is_set() and not printer.closed:
            for rec in await feed.next_batch(timeout=_IDLE_POLL_S):
                printer.line(history_line(rec))
            if bus.nc.is_closed:  # the stack went away and the one reconnect failed
                die("lost the connection to the stack's NATS", EXIT_SERVER)


def events(
    sandbox_id: Annotated[
        str | None,
        typer.Argument(
            help="Sandbox (or lease) whose history to print; without it, --follow shows every "
            "sandbox.",
            show_default=False,
        ),
    ] = None,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            "-f",
            help="Keep printing events as they are appended, until Ctrl-C. With ID: "
            "its history first, then live; without: every sandbox, from now on.",
        ),
    ] = False,
    output: Annotated[
        Format,
        typer.Option(
            "--output",
            "-o",
            help="table on a terminal, json (one object per line) when piped; or force one.",
        ),
    ] = Format.auto,
    data_dir: StackDir = DEFAULT_DATA_DIR,
) -> None:
    """A sandbox's history and fork lineage from the event log; --follow watches live.

    Prints every event of SANDBOX_ID (what, when, who, caused by what), then its fork
    lineage as a tree, from the first ancestor down to every fork child. With --follow,
    events are printed as they are appended until Ctrl-C (exit 0). JSON, one object per
    line: seq, aggregate_id (the sandbox), revision, at, type, actor, causation_id,
    correlation_id, details. Reads the stack's NATS directly: run it where `aenv up` runs.
    """
    import asyncio

    from bus import Bus, BusSettings

    if sandbox_id is None and not follow:
        die("give a sandbox ID, or --follow to watch every sandbox", EXIT_USAGE)
    info = running_stack(data_dir)
    printer = _Printer(wants_json(output), with_id=sandbox_id is None)

    async def run() -> Family | None:
        settings = BusSettings(nats_url=str(info["nats_url"]))
        bus = await Bus.connect(settings, setup=False, retry=False)
        try:
            if follow:
                await _follow(bus, sandbox_id, printer)
                return None
            assert sandbox_id is not None
            return await _history(bus, sandbox_id, printer)
        finally:
            await bus.close()

    try:
        with operator_errors("events"):
            family = asyncio.run(run())
    except KeyboardInterrupt:  # before the follow loop took over SIGINT
        raise typer.Exit(0 if follow else 130) from None
    if family is not None and family.has_forks:
        printer.write("")
        printer.write("FORK LINEAGE")
        for line in render(family, current=sandbox_id):
            printer.write(line)
