"""A "trainer" for the lease test (`python -m tests.vmless.lease_trainer N TTL`): opens a
lease, creates N sandboxes under it with the unchanged e2b SDK (E2B_API_URL/E2B_API_KEY
from the environment), prints `READY <lease id> <ids…>` and renews the lease every second
until it is killed — what a training job does, and what its crash leaves behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import httpx
from e2b import Sandbox


def start(
    count: int, ttl: float, env: Mapping[str, str]
) -> tuple[subprocess.Popen[str], str, list[str]]:
    """A trainer process holding `count` sandboxes under a lease of `ttl` s, once READY:
    (the process, its lease id, its sandbox ids). `env` points the SDK at the stack."""
    trainer = subprocess.Popen(
        [sys.executable, "-m", "tests.vmless.lease_trainer", str(count), str(ttl)],
        stdout=subprocess.PIPE,
        env={**os.environ, **env},
        text=True,
    )
    assert trainer.stdout is not None
    line = trainer.stdout.readline().split()
    if line[:1] != ["READY"]:
        trainer.kill()
        raise AssertionError(f"the trainer never got ready: {line} (exit {trainer.poll()})")
    return trainer, line[1], line[2:]


def main() -> None:
    count, ttl = int(sys.argv[1]), float(sys.argv[2])
    api = httpx.Client(
        base_url=os.environ["E2B_API_URL"],
        headers={"X-API-KEY": os.environ["E2B_API_KEY"]},
        timeout=30,
    )
    r = api.post("/leases", json={"ttl": ttl})
    r.raise_for_status()
    lease = r.json()["leaseID"]

    def create(i: int) -> str:
        meta = {"aenv.lease": lease, "episode": str(i)}
        return Sandbox.create(timeout=600, metadata=meta).sandbox_id

    with ThreadPoolExecutor(8) as pool:
        futures = []
        for i in range(count):
            futures.append(pool.submit(create, i))
        ids = []
        for f in futures:
            ids.append(f.result())
            api.post(f"/leases/{lease}/renew").raise_for_status()  # while the creates go on
    print("READY", lease, *ids, flush=True)
    while True:
        api.post(f"/leases/{lease}/renew").raise_for_status()
        time.sleep(1)


if __name__ == "__main__":
    main()
