"""Record golden histories: every stored event of some aggregates, as the raw envelopes the
log holds, plus the state they fold to with the code of the day.

    python -m tests.golden.record NATS_URL PREFIX OUT_DIR KIND:ID [KIND:ID ...]

`tests/golden/test_golden.py` then checks that every later version of the code still
decodes those bytes (upcasting old schema versions) and folds them to the same state.
Histories are recorded once, from a real stack, and never edited by hand."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from nats.js.errors import NotFoundError

from bus import Bus, BusSettings
from domain import aggregate_of


async def record(nats_url: str, prefix: str, out: Path, targets: list[str]) -> None:
    bus = await Bus.connect(BusSettings(nats_url=nats_url, bus_prefix=prefix), setup=False)
    try:
        for target in targets:
            kind, aggregate_id = target.split(":", 1)
            store = bus.store(aggregate_of(kind))
            subject = store.subject(aggregate_id)
            lines, seq = [], 0
            while True:
                try:
                    raw = await bus.js.get_msg(
                        bus.names.event_stream, seq=seq + 1, subject=subject, next=True, direct=True
                    )
                except NotFoundError:
                    break
                lines.append((raw.data or b"").decode())
                seq = raw.seq or 0
            state, _ = await store.load(aggregate_id)
            name = f"{kind}-{aggregate_id}"
            (out / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
            folded = None if state is None else state.model_dump(mode="json")
            doc = json.dumps({"kind": kind, "state": folded}, indent=1, sort_keys=True)
            (out / f"{name}.state.json").write_text(doc + "\n")
            print(f"{name}: {len(lines)} events")
    finally:
        await bus.close()


if __name__ == "__main__":
    url, prefix, out, *targets = sys.argv[1:]
    asyncio.run(record(url, prefix, Path(out), targets))
