"""Templates on every node, measured (images-at-scale S5/S6; `image_bench --fleet`): the
first create of a template on a node that never held it — its capture fetched from the
repository and stacked over base bytes the node fetched when it started — against a create
on the node that built it, with the bytes each fetch moved.

Two nodes of `bench.fleetrig` (one API, SeaweedFS, NATS), no warm VMs: node A keeps the
machine's image cache and builds `n` small templates (`Template.build`: base + one RUN
step) through the unchanged `e2b` SDK; each is created once on A. Node B, with an image
cache of its own and empty, starts only then (its start fetches the base image and envd's
runtime disk: bytes and seconds from its metrics), A stops, and each template is created
on B twice: the first create fetches the capture (bytes from B's log), the second finds it.
Beside it, in the same run, the raw primitive: QEMU restoring the base guest with no
control plane (`fleet_bench.raw_primitive`).
"""

from __future__ import annotations

import re
import secrets
import time
import uuid
from pathlib import Path
from typing import Any

from bench.fleetrig import Fleet, fleet_rig
from bench.stats import ratio, summary

METRICS_TOKEN = "bench-" + secrets.token_hex(8)
_PULLED = re.compile(r"pulled (\S+) from the repository \((\d+) blobs, (\d+) bytes\)")


def _create(fleet: Fleet, name: str, expect: str) -> tuple[float, str]:
    """Seconds from `Sandbox.create` to its first command's answer, and its node."""
    import httpx
    from e2b import Sandbox

    t0 = time.monotonic()
    url = fleet.api_url(0)
    sbx = Sandbox.create(name, timeout=300, api_url=url, sandbox_url=url, api_key=fleet.api_key)
    try:
        out = sbx.commands.run("cat /opt/mark").stdout
        took = time.monotonic() - t0
        if out != expect:
            raise RuntimeError(f"{name}: {out!r} != {expect!r}")
        r = httpx.get(
            f"{fleet.api_url(0)}/sandboxes/{sbx.sandbox_id}",
            headers={"X-API-KEY": fleet.api_key},
        )
        return took, str(r.json()["nodeID"])
    finally:
        sbx.kill()


def _node_fetches(fleet: Fleet, node: str) -> dict[str, float]:
    from bus import BusSettings
    from tests.series import node_url, scrape

    samples = scrape(node_url(BusSettings(nats_url=fleet.nats.url), node), METRICS_TOKEN)
    mine = frozenset({("node", node)})
    return {
        "images": samples.get(("aenv_image_fetches_total", mine), 0.0),
        "bytes": samples.get(("aenv_image_fetch_bytes_total", mine), 0.0),
        "seconds": round(samples.get(("aenv_image_fetch_seconds_total", mine), 0.0), 2),
    }


def fetch_vs_local(root: Path, n: int, raw: dict[str, Any]) -> dict[str, Any]:
    """The measurement above; `raw`: `fleet_bench.raw_primitive`'s result."""
    from e2b import Template

    from tests.support import session_tag

    env = {"AENV_HEARTBEAT_S": "1", "AENV_WARM_POOL_MIB": "0", "AENV_METRICS_TOKEN": METRICS_TOKEN}
    node_env = {"fleet-b": {"AENV_IMAGE_CACHE": str(root / "fleet-b-images")}}
    with fleet_rig(
        root, apis=1, nodes=2, env=env, tag=session_tag(), node_env=node_env, started=1
    ) as fleet:
        run = uuid.uuid4().hex[:6]
        names = {f"imgb-{run}-{i}": f"template {i}\n" for i in range(n)}
        builds: list[float] = []
        for name, mark in names.items():
            t0 = time.monotonic()
            step = f"echo '{mark.strip()}' > /opt/mark"
            Template.build(
                Template().from_template("base").run_cmd(step),
                name,
                api_key=fleet.api_key,
                api_url=fleet.api_url(0),
            )
            builds.append(time.monotonic() - t0)
        for name in names:
            deadline = time.monotonic() + 300
            while fleet.capture_key(name) is None:  # uploaded: the capture any node can fetch
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name}: its capture was never uploaded")
                time.sleep(1)
        on_builder = [_create(fleet, name, mark) for name, mark in names.items()]
        b = fleet.nodes[1]
        t0 = time.monotonic()
        b.start()
        b.wait_ready()
        b_start = time.monotonic() - t0
        start_fetch = _node_fetches(fleet, "fleet-b")
        fleet.nodes[0].stop()
        time.sleep(4)  # A's heartbeat ends: the API counts it gone
        first = [_create(fleet, name, mark) for name, mark in names.items()]
        again = [_create(fleet, name, mark) for name, mark in names.items()]
        pulls = [
            (m.group(1), int(m.group(3)))
            for m in _PULLED.finditer(b.log.read_text(errors="replace"))
        ]
    if {node for _, node in on_builder} != {"fleet-a"} or {node for _, node in first + again} != {
        "fleet-b"
    }:
        raise RuntimeError(f"creates landed elsewhere: {on_builder} {first} {again}")
    restore = raw["restore_to_envd"]
    local, fetched, held = (summary([t for t, _ in xs]) for xs in (on_builder, first, again))
    return {
        "templates": n,
        "template_build": summary(builds, unit="s", scale=1.0),
        "create_on_builder": local,
        "first_create_on_new_node": fetched,
        "second_create_on_new_node": held,
        "first_over_builder_p50": ratio(fetched, local),
        "builder_over_raw_restore_p50": ratio(local, restore),
        "first_over_raw_restore_p50": ratio(fetched, restore),
        "new_node_start": {"seconds": round(b_start, 1), "image_fetches": start_fetch},
        "capture_fetches": {
            "count": len(pulls),
            "bytes": summary([float(b) for _, b in pulls], unit="MiB", scale=1 / (1 << 20)),
        },
    }
