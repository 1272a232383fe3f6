"""One leased repository GC round in a process of its own: what a crash test kills -9.

`python -m tests.integration.bus.gcpass '<json>'` with the bus namespace, the S3 store
(an `S3Config` as a dict), the node id and the lease period. It runs `RepositoryGc.run_once`
as a node does (`min_age` and the image grace 0: everything unnamed is garbage) and prints
one JSON line: whether it held the lease, and the blobs it deleted.
"""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import timedelta

from bus import Bus, BusSettings
from workers.snapshot import S3Store
from workers.snapshot.gcrun import RepositoryGc
from workers.snapshot.janitor import RepositoryJanitor
from workers.snapshot.s3 import S3Config


async def main(args: dict[str, object]) -> None:
    settings = BusSettings(nats_url=str(args["nats_url"]), bus_prefix=str(args["prefix"]))
    bus = await Bus.connect(settings, name="gc-pass")
    store = await S3Store.open(S3Config(**args["s3"]))  # type: ignore[arg-type]
    try:
        gc = RepositoryGc(
            bus,
            RepositoryJanitor(bus, store),
            str(args["node"]),
            every_s=float(args["every_s"]),  # type: ignore[arg-type]
            min_age=timedelta(0),
            image_grace=timedelta(0),
        )
        report = await gc.run_once()
        deleted = None if report is None else len(report.deleted)
        print(json.dumps({"ran": report is not None, "deleted": deleted}), flush=True)
    finally:
        await store.close()
        await bus.close()


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
